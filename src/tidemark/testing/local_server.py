"""What the private test servers share: a free port, and an unprivileged OS user to run
database servers that refuse root (``initdb``, ``postgres``) or should not run as root
(``mariadbd``)."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def ensure_os_user(name: str) -> pwd.struct_passwd:
    """The OS user *name*, created (a system user without home or shell) if missing."""
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    useradd = shutil.which("useradd") or "/usr/sbin/useradd"
    subprocess.run(
        [useradd, "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
        check=True,
        capture_output=True,
    )
    return pwd.getpwnam(name)


def demote_to(uid: int, gid: int) -> None:
    """Become *uid*/*gid* (in a child process before ``exec``)."""
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
