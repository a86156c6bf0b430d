"""What every package of kern shares and may import from anywhere: modules that import nothing of the
project (leaves). `kern.errors` holds the root of every exception the project raises."""
