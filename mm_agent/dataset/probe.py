"""Probing one media file, in a worker process: what MindSpeed-MM will find when it opens it.

Runs in the scan's process pool only (decord, PyAV and Pillow are imported here, never in the MCP server).
A video is opened with decord, as MindSpeed-MM's `DecordVideo` reader does: frame count, fps, frame size,
and its first and last frames decoded (a truncated file opens but fails there); PyAV reads the codec from the
container header. An image is opened and fully decoded with Pillow. Every file is hashed (SHA-256, read in
1 MiB blocks) for the duplicate check. A failure is a result with `error`, never an exception: one bad file
must not stop the scan.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

VIDEO_EXTS = frozenset({".mp4", ".mov", ".mkv", ".webm", ".avi"})
IMAGE_EXTS = frozenset({".jpg", ".jpeg", ".png", ".webp"})
_BLOCK = 1 << 20


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _video(path: str) -> dict[str, Any]:
    import decord

    reader = decord.VideoReader(path, num_threads=1)
    frames = len(reader)
    fps = float(reader.get_avg_fps())
    if frames <= 0:
        return {"frames": 0, "fps": fps, "height": 0, "width": 0, "error": "zero_frames"}
    first = reader[0].shape
    reader[frames - 1]  # decodes from the last keyframe: a cut-off tail fails here
    out: dict[str, Any] = {"frames": frames, "fps": fps, "height": int(first[0]), "width": int(first[1])}
    out["codec"] = _bmff_codec(path) if path.lower().endswith((".mp4", ".mov")) else None
    if out["codec"] is None:
        try:
            import av

            with av.open(path) as container:
                out["codec"] = container.streams.video[0].codec_context.name
        except Exception:  # the codec is informative only; decord already read the file
            out["codec"] = None
    return out


_FOURCC = {
    "avc1": "h264",
    "avc3": "h264",
    "hvc1": "hevc",
    "hev1": "hevc",
    "av01": "av1",
    "vp09": "vp9",
    "mp4v": "mpeg4",
    "mjpa": "mjpeg",
    "jpeg": "mjpeg",
    "apcn": "prores",
    "apch": "prores",
}
_CONTAINERS = {b"moov", b"trak", b"mdia", b"minf", b"stbl"}


def _bmff_codec(path: str) -> str | None:
    """The first video sample entry of an MP4/MOV (`moov/trak/mdia/minf/stbl/stsd`), read box header by box
    header: a few small reads instead of opening the container with a demuxer (which costs as much as the
    decord probe itself). None when the layout is not the usual one; the caller then asks PyAV."""
    with open(path, "rb") as fh:
        end = os.fstat(fh.fileno()).st_size

        def boxes(start: int, stop: int) -> list[tuple[bytes, int, int]]:
            found: list[tuple[bytes, int, int]] = []
            pos = start
            while pos + 8 <= stop and len(found) < 64:
                fh.seek(pos)
                head = fh.read(16)
                size, kind = int.from_bytes(head[:4], "big"), head[4:8]
                body = pos + 8
                if size == 1:
                    size, body = int.from_bytes(head[8:16], "big"), pos + 16
                elif size == 0:
                    size = stop - pos
                if size < 8:
                    return found
                found.append((kind, body, pos + size))
                pos += size
            return found

        level = boxes(0, end)
        for name in (b"moov", b"trak", b"mdia", b"minf", b"stbl", b"stsd"):
            for kind, body, stop in level:
                if kind == name and (kind in _CONTAINERS or kind == b"stsd"):
                    if kind == b"stsd":  # version/flags (4) + entry count (4), then the first sample entry
                        fh.seek(body + 8 + 4)
                        return _FOURCC.get(fh.read(4).decode("latin-1"))
                    level = boxes(body, stop)
                    break
            else:
                return None
    return None


def _image(path: str) -> dict[str, Any]:
    from PIL import Image

    with Image.open(path) as img:
        img.load()  # a truncated image fails here, not at training time
        return {"frames": 1, "fps": None, "width": img.width, "height": img.height, "codec": img.format}


_MAGIC = (
    (b"\x89PNG", "image"),
    (b"\xff\xd8\xff", "image"),
    (b"GIF8", "image"),
    (b"\x1aE\xdf\xa3", "video"),  # Matroska / WebM
)


def _sniff(path: str) -> str | None:
    """'video' or 'image' by the file's first bytes (for a decode failure: is the extension wrong?)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(16)
    except OSError:
        return None
    if head[4:8] == b"ftyp" or (head[:4] == b"RIFF" and head[8:12] == b"AVI "):
        return "video"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image"
    return next((kind for magic, kind in _MAGIC if head.startswith(magic)), None)


def probe_file(path: str) -> dict[str, Any]:
    """`{kind, frames, fps, height, width, codec, sha256, size, mtime_ns}` or the same with `error` set."""
    ext = os.path.splitext(path)[1].lower()
    kind = "video" if ext in VIDEO_EXTS else "image" if ext in IMAGE_EXTS else "other"
    base: dict[str, Any] = {"kind": kind}
    try:
        st = os.stat(path)
        base |= {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
        if st.st_size == 0:
            return base | {"error": "empty"}
        base["sha256"] = _sha256(path)
        return base | (_video(path) if kind == "video" else _image(path))
    except Exception as exc:  # any decoder failure is this file's verdict
        real = _sniff(path)
        if real is not None and real != kind:
            return base | {"error": "mislabelled", "detail": f"its bytes are {real} data"}
        return base | {"error": "unreadable", "detail": f"{type(exc).__name__}: {str(exc)[:200]}"}


def probe_batch(paths: list[str]) -> list[dict[str, Any]]:
    """Several files per task: one round trip to the pool for many small files."""
    return [probe_file(p) for p in paths]
