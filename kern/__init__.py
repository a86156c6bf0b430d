"""What every package of kern shares and may import from anywhere: modules that import nothing of the
project (leaves). `kern.errors` holds the root of every exception the project raises. One module is
no leaf: `kern.cli`, the `kern` command's face, which may import every package and which none imports."""
