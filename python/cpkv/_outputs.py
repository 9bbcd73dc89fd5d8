"""Where the Python front ends may write: the cpkv command's output rules (cli/files.cpp,
OutputFile and refuse_same_files), checked before any work, and every write made whole or not at all.

An output is a regular file or a new name in an existing folder this user may write: never a pipe
(it would block after the whole run), a folder, a device (/dev/full), a /proc file, a link to
anything but a regular file or a link loop; never an input of the same run, the file standard output
or standard error goes to, or another output of the same run (one of the two would be lost). What a
run writes goes to a hidden temporary file in the target's folder, renamed over the target only once
it is whole, so a full disk or a killed run leaves the old file as it was (issue 34, items 1 and 7).
No torch here: `import cpkv` uses it.
"""

from __future__ import annotations

import errno as errno_module
import os
import stat
import tempfile
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence, Tuple, Union

from ._errors import InputError

PathLike = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]
# Hidden, beside the target, with the creator's pid (the CLI's ".cpkv-<pid>-" stem: its sweep knows them).
TEMP_PREFIX = ".cpkv-{pid}-"


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISFIFO, "a pipe"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a regular file"


def _why(error: OSError) -> str:
    return os.strerror(error.errno) if error.errno else str(error)


@dataclass
class Output:
    """A checked output: what the user named (option, path) and the absolute file it replaces."""

    option: str
    path: str
    target: str
    existed: bool = False
    file_id: Optional[Tuple[int, int]] = None
    mode: int = 0
    owner: Tuple[int, int] = (-1, -1)

    def refuse(self, reason: str) -> InputError:
        return InputError(self.option, f"cannot write {self.path}: {reason}")


def check_output(option: str, path: PathLike) -> Output:
    """The output `path` of option `option` checked as the CLI checks one; InputError(option, ...) if refused."""
    text = os.fsdecode(path) if not isinstance(path, str) else path
    if text == "":
        raise InputError(option, "an empty file name")
    if text == "-":
        raise InputError(option, "'-' is not accepted (standard output carries the report); give a file name")
    out = Output(option, text, "")
    try:
        st = os.lstat(text)
    except FileNotFoundError:
        st = None
    except OSError as error:
        raise out.refuse(_why(error)) from None
    if st is None:
        _check_new_name(out)
    else:
        _check_existing(out, st)
    folder = os.path.dirname(out.target)
    if not os.access(folder, os.W_OK | os.X_OK):
        raise out.refuse(f"folder {folder}: {os.strerror(errno_module.EACCES)}")
    _check_replaceable(out, folder)
    return out


def _check_new_name(out: Output) -> None:
    parent = os.path.dirname(out.path) or "."
    try:
        dir_st = os.stat(parent)
    except OSError as error:
        raise out.refuse(f"folder {parent}: {_why(error)}") from None
    if not stat.S_ISDIR(dir_st.st_mode):
        raise out.refuse(f"{parent} is not a folder")
    out.target = os.path.join(os.path.realpath(parent), os.path.basename(out.path))
    if os.path.basename(out.path) in ("", ".", ".."):
        raise out.refuse("names a folder, not a file")


def _check_existing(out: Output, st: os.stat_result) -> None:
    if stat.S_ISLNK(st.st_mode):
        # A link to a regular file writes that file, in its folder; a link to anything else is refused.
        try:
            st = os.stat(out.path)
        except OSError as error:
            raise InputError(out.option, f"{out.path} is a symbolic link to nothing ({_why(error)})") from None
        if not stat.S_ISREG(st.st_mode):
            raise InputError(out.option, f"{out.path} is a symbolic link to {_kind(st.st_mode)}; outputs are regular files only")
    if not stat.S_ISREG(st.st_mode):
        raise InputError(out.option, f"{out.path} is {_kind(st.st_mode)}; outputs are regular files only")
    if not os.access(out.path, os.W_OK):
        raise out.refuse(os.strerror(errno_module.EACCES))
    out.target = os.path.realpath(out.path)
    out.existed, out.file_id = True, (st.st_dev, st.st_ino)
    out.mode, out.owner = stat.S_IMODE(st.st_mode), (st.st_uid, st.st_gid)


def _check_replaceable(out: Output, folder: str) -> None:
    """What the final rename needs, tried now: a file can be made in the folder (not in /proc, on a
    read-only mount), and in a sticky folder another user's file is replaced only by its owner."""
    try:
        dir_st = os.stat(folder)
    except OSError as error:
        raise out.refuse(f"folder {folder}: {_why(error)}") from None
    me = os.geteuid()
    if out.existed and dir_st.st_mode & stat.S_ISVTX and me != 0 and out.owner[0] != me and dir_st.st_uid != me:
        raise InputError(out.option, f"cannot replace {out.path}: it belongs to another user in the sticky folder {folder}")
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=TEMP_PREFIX.format(pid=os.getpid()))
    except OSError as error:
        raise out.refuse(f"cannot create a file in {folder}: {_why(error)}") from None
    os.close(fd)
    os.unlink(probe)


def _file_id(path: PathLike) -> Optional[Tuple[int, int]]:
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISREG(st.st_mode) else None


def refuse_same_files(inputs: Iterable[Tuple[str, PathLike]], outputs: Sequence[Optional[Output]]) -> None:
    """No output is an input, the file standard output or standard error goes to, or another output."""
    streams = []
    for fd, name in ((1, "standard output"), (2, "standard error")):
        try:
            st = os.fstat(fd)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            streams.append(((st.st_dev, st.st_ino), name))
    given = [o for o in outputs if o is not None]
    for k, out in enumerate(given):
        for file_id, name in streams:
            if out.file_id == file_id:
                raise InputError(out.option, f"{out.path} is the file {name} goes to; give another file")
        for option, path in inputs:
            if out.file_id is not None and out.file_id == _file_id(path):
                raise InputError(out.option, f"{out.path} is the same file as the input {os.fsdecode(path)} ({option}); "
                                             "refusing to overwrite an input")
        for earlier in given[:k]:
            if earlier.target == out.target:
                raise InputError(out.option, f"{out.path} is the same file as {earlier.option} {earlier.path}")


class OutputWriteError(RuntimeError):
    """A checked output that could not be written (a full disk, a folder removed meanwhile): the old
    file is left as it was. One line: `option: cannot write path: step: reason; the file was left as it was`."""


def temporary_beside(out: Output, suffix: str = "") -> str:
    """A new hidden file in the target's folder (so the final rename is atomic); its path."""
    fd, path = tempfile.mkstemp(dir=os.path.dirname(out.target), prefix=TEMP_PREFIX.format(pid=os.getpid()), suffix=suffix)
    os.close(fd)
    return path


def commit(out: Output, temporary: str) -> None:
    """The whole temporary, flushed to disk, renamed over the target with the old file's mode and owner."""
    step = "fsync"
    try:
        fd = os.open(temporary, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        if out.existed:
            step = "chown"
            try:
                os.chown(temporary, *out.owner)
            except PermissionError:
                pass  # not ours to give: the file is this user's
            mode = out.mode
        else:
            mask = os.umask(0)
            os.umask(mask)
            mode = 0o666 & ~mask
        step = "chmod"
        os.chmod(temporary, mode)
        step = "rename"
        os.replace(temporary, out.target)
    except OSError as error:
        discard(temporary)
        raise OutputWriteError(f"{out.option}: cannot write {out.path}: {step}: {_why(error)}; the file was left as it was") from None


def discard(temporary: str) -> None:
    try:
        os.unlink(temporary)
    except OSError:
        pass


def write_all(fd: int, data: bytes) -> None:
    """Every byte of data to fd (os.write may write fewer than asked)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_output(out: Output, data: bytes) -> None:
    """data replaces the target whole, or the target is left as it was (OutputWriteError)."""
    try:
        temporary = temporary_beside(out, os.path.splitext(out.target)[1][:16])
    except OSError as error:
        raise OutputWriteError(f"{out.option}: cannot write {out.path}: create: {_why(error)}; the file was left as it was") from None
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            write_all(fd, data)
        finally:
            os.close(fd)
    except OSError as error:
        discard(temporary)
        raise OutputWriteError(f"{out.option}: cannot write {out.path}: write: {_why(error)}; the file was left as it was") from None
    commit(out, temporary)


def check_input_file(option: str, path: PathLike) -> None:
    """An input read by path more than once (the conformance trace: read here, then by `cpkv bench`
    and a reproducer) must be a regular file: a pipe would block the read until a writer came, for
    good (issue 34, item 12). stat() alone, which never blocks; a missing file is left to the reader,
    which names it."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return
    if not stat.S_ISREG(st.st_mode):
        kind = _kind(st.st_mode)
        what = kind if kind == "not a regular file" else f"{kind}, not a regular file"
        raise InputError(option, f"{os.fsdecode(path)} is {what} (give a trace file)")
