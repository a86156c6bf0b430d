"""Leaves every room of serve/ may import; they import nothing of serve/ beyond this room.

    logs.py       key=value event lines
    hosted.py     what a server takes from the process it runs in (its own, or a host's command)
    exits.py      `kern serve`'s exit codes
    startup.py    where a server's start went, by phase
    api_error.py  `ApiError`: an OpenAI-style error, raised by the routes and the remote client
"""
