"""Names people import that are published under another name (``sklearn`` → ``scikit-learn``).

Design: ``PUBLISHED_AS`` maps import names (PEP 503 normal form) to the distribution that
provides the module; only names that differ after normalisation belong here. ``installer.py``
retries a failed install once under the published name, with a note (``serial``, ``jwt``,
``docx``, ``bson`` are other projects on the index). ``cv2`` maps to the headless OpenCV: the
sandbox has no display.

Error policy: nothing here raises.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

PUBLISHED_AS: dict[str, str] = {
    canonicalize_name(module): dist
    for module, dist in {
        # data science and machine learning
        "sklearn": "scikit-learn",
        "skimage": "scikit-image",
        "skopt": "scikit-optimize",
        "skbio": "scikit-bio",
        "imblearn": "imbalanced-learn",
        "umap": "umap-learn",
        "faiss": "faiss-cpu",
        "community": "python-louvain",
        "whisper": "openai-whisper",
        "absl": "absl-py",
        "Bio": "biopython",
        "osgeo": "GDAL",
        # images, audio, documents
        "PIL": "pillow",
        "cv2": "opencv-python-headless",
        "fitz": "PyMuPDF",
        "docx": "python-docx",
        "pptx": "python-pptx",
        "odf": "odfpy",
        "pdfminer": "pdfminer.six",
        "fpdf": "fpdf2",
        "camelot": "camelot-py",
        "tabula": "tabula-py",
        "barcode": "python-barcode",
        "cairo": "pycairo",
        "OpenGL": "PyOpenGL",
        "speech_recognition": "SpeechRecognition",
        "ffmpeg": "ffmpeg-python",
        "magic": "python-magic",
        # text, data formats, dates
        "yaml": "PyYAML",
        "ruamel": "ruamel.yaml",
        "bs4": "beautifulsoup4",
        "dateutil": "python-dateutil",
        "slugify": "python-slugify",
        "readability": "readability-lxml",
        "newspaper": "newspaper3k",
        # web, networking, services
        "dotenv": "python-dotenv",
        "decouple": "python-decouple",
        "multipart": "python-multipart",
        "jose": "python-jose",
        "jwt": "PyJWT",
        "socks": "PySocks",
        "websocket": "websocket-client",
        "socketio": "python-socketio",
        "engineio": "python-engineio",
        "zmq": "pyzmq",
        "paho": "paho-mqtt",
        "kafka": "kafka-python",
        "grpc": "grpcio",
        "dns": "dnspython",
        "git": "GitPython",
        "github": "PyGithub",
        "telegram": "python-telegram-bot",
        "discord": "discord.py",
        "rest_framework": "djangorestframework",
        "corsheaders": "django-cors-headers",
        "environ": "django-environ",
        # databases
        "MySQLdb": "mysqlclient",
        "psycopg2": "psycopg2-binary",
        "bson": "pymongo",
        "snowflake": "snowflake-connector-python",
        "memcache": "python-memcached",
        "ldap": "python-ldap",
        # security and cryptography
        "Crypto": "pycryptodome",
        "Cryptodome": "pycryptodomex",
        "OpenSSL": "pyOpenSSL",
        "nacl": "PyNaCl",
        "argon2": "argon2-cffi",
        "gnupg": "python-gnupg",
        # system and hardware
        "attr": "attrs",
        "serial": "pyserial",
        "usb": "pyusb",
        "can": "python-can",
        "Xlib": "python-xlib",
        "gi": "PyGObject",
        "wx": "wxPython",
        "win32api": "pywin32",
        "pkg_resources": "setuptools",
    }.items()
}


def published_as(name: str) -> str | None:
    """The distribution that provides the module imported as ``name``, when it is another name."""
    return PUBLISHED_AS.get(canonicalize_name(name))


def substitute(requirements: Sequence[Requirement]) -> tuple[list[Requirement], dict[str, str]]:
    """``requirements`` with import names replaced by their distributions (version, extras and
    markers kept), and ``{asked: published}`` for what was replaced."""
    out: list[Requirement] = []
    replaced: dict[str, str] = {}
    for req in requirements:
        dist = published_as(req.name)
        if dist is None:
            out.append(req)
            continue
        new = Requirement(str(req).replace(req.name, dist, 1))
        replaced[req.name] = dist
        out.append(new)
    return out, replaced


def substitution_note(replaced: dict[str, str], installed: Collection[str]) -> str:
    """The note for ``replaced`` import names; ``installed``: canonical names this call installed
    (the rest were there already)."""
    said = "; ".join(
        f"{asked} is the name you import, published as {dist!r}" for asked, dist in replaced.items()
    )
    if any(canonicalize_name(dist) in installed for dist in replaced.values()):
        return f"{said}: installed under the published name (ask for that name next time)."
    return (
        f"{said}, which is already installed: nothing was installed (ask for the published name next time)."
    )


def other_project_note(asked: str, dist: str) -> str:
    return (
        f"{asked!r} was installed as asked, but the module usually imported as {asked} comes from "
        f"{dist!r} (a different project): if `import {asked}` is not what you expected, install {dist!r}."
    )
