"""What `gateway skills add` (and `approve`, and an agent's draft) refuses: the tricks the
poisoned skill registries used, each found by a plain reading of the files (docs/skills.md).

- an encoded payload piped to a shell or interpreter (`echo ... | base64 -d | bash`)
- a download piped to a shell (`curl ... | sh`, `bash <(wget -qO- ...)`, `iwr ... | iex`)
- a password-protected archive: a zip with its encryption flag set, any 7z or rar (their
  content cannot be read here), or a "password" given next to an archive's name or link
- a binary: an executable anywhere (ELF, Mach-O, PE, a shebang-less blob), and any file that is
  not text outside `assets/` (where images and fonts may live)
- a link to an executable download (.exe .msi .dmg .pkg .sh .ps1 .bat .scr .appimage .deb .rpm)
- an instruction to turn off the sandbox or the approvals
- a symbolic link (it could point at anything on the machine)

Each finding is one line: the file, the line, what it is. `--force` adds a skill anyway and
records the reasons with the pin; nothing here makes a skill safe, it keeps out the known attacks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from gateway.skills.folder import MAX_FILE_BYTES, walk

ASSETS = "assets/"  # the one folder where files that are not text are allowed (still no executables)

_SHELL = r"(?:sudo\s+)?(?:/usr)?(?:/bin/)?(?:ba|z|k|da|fi|c|tc)?sh\b"
_INTERP = rf"(?:{_SHELL}|python[0-9.]*\b|perl\b|ruby\b|node\b|php\b|iex\b|invoke-expression\b|pwsh\b|powershell\b)"
_DECODE = r"(?:base64\s+(?:-\w*d\w*|--decode)|b64decode|frombase64string|xxd\s+-r|openssl\s+(?:base64|enc)\b[^\n|]*-d\b|\bbase32\s+-d|uudecode)"  # noqa: E501
_FETCH = r"(?:\bcurl\b|\bwget\b|\biwr\b|invoke-webrequest|invoke-restmethod|\birm\b|\bfetch\s+-o|\baria2c\b)"
_EXE_EXT = r"(?:exe|msi|dmg|pkg|sh|ps1|bat|cmd|scr|appimage|deb|rpm|jar|run|bin|command|app)"
_ARCHIVE = r"\S+\.(?:zip|7z|rar|tar(?:\.gz|\.xz|\.bz2)?|tgz|gz)\b"

PATTERNS: list[tuple[str, str, re.Pattern[str]]] = [
    (
        "encoded-payload",
        "an encoded payload run by a shell",
        re.compile(
            rf"{_DECODE}[^\n]*(?:\|\s*{_INTERP}|\)\s*\"?\s*$)|(?:\beval\b|\bexec\b|{_SHELL}\s+-c|<\(|\$\()[^\n]*{_DECODE}",
            re.I | re.M,
        ),
    ),
    (
        "download-to-shell",
        "a download piped to a shell",
        re.compile(
            rf"{_FETCH}[^\n]*\|\s*{_INTERP}|(?:{_SHELL}|\bsource)\s*(?:-c\s*)?[\"']?\s*(?:<\(|\$\()\s*{_FETCH}"
            rf"|\biex\b[^\n]*{_FETCH}|{_FETCH}[^\n]*&&\s*(?:chmod\s+\+x|{_SHELL}\s+\S+\.sh)",
            re.I,
        ),
    ),
    (
        "archive-password",
        "a password-protected archive",
        re.compile(
            rf"{_ARCHIVE}[\s\S]{{0,200}}?\b(?:password|passphrase|passwd|pwd)\b"
            rf"|\b(?:password|passphrase|passwd|pwd)\b[\s\S]{{0,200}}?{_ARCHIVE}"
            r"|\b(?:unzip|7z|7za|unrar)\b[^\n]*\s-p\S+",
            re.I,
        ),
    ),
    (
        "executable-link",
        "a link to an executable download",
        re.compile(rf"(?:https?|ftp)://[^\s)\"'<>]+\.{_EXE_EXT}(?:[?#][^\s)\"'<>]*)?(?=[\s)\"'<>.,;]|$)", re.I | re.M),
    ),
    (
        "disables-safety",
        "an instruction to turn off the sandbox or the approvals",
        re.compile(
            r"\b(?:disable|turn\s+off|switch\s+off|bypass|skip|ignore|remove|deactivate|circumvent)\b[^\n.]{0,40}"
            r"\b(?:sandbox(?:ing)?|bubblewrap|bwrap|approvals?|approval\s+prompts?|confirmations?|permission\s+prompts?)\b"
            r"|shell_sandbox\s*[:=]\s*[\"']?none|--no-sandbox\b|dangerously[-_]skip[-_]permissions|\byolo\s+mode\b"
            r"|\bauto[-_ ]?approve\b|\bwithout\s+(?:asking\s+for\s+)?(?:approval|confirmation|asking\s+the\s+user)\b"
            r"|\baction\s*:\s*allow\b[^\n]*\btool\s*:\s*[\"']?\*",
            re.I,
        ),
    ),
]

_MAGIC: list[tuple[bytes, str]] = [
    (b"\x7fELF", "an ELF executable"),
    (b"MZ", "a Windows (PE) executable"),
    (b"\xfe\xed\xfa\xce", "a Mach-O executable"),
    (b"\xfe\xed\xfa\xcf", "a Mach-O executable"),
    (b"\xce\xfa\xed\xfe", "a Mach-O executable"),
    (b"\xcf\xfa\xed\xfe", "a Mach-O executable"),
    (b"\xca\xfe\xba\xbe", "a Mach-O universal executable or Java class"),
    (b"\x00asm", "a WebAssembly module"),
]
_7Z = b"7z\xbc\xaf\x27\x1c"
_RAR = (b"Rar!\x1a\x07\x00", b"Rar!\x1a\x07\x01\x00")
_ZIP = b"PK\x03\x04"


@dataclass(frozen=True)
class Finding:
    kind: str  # encoded-payload | download-to-shell | archive-password | binary | executable-link | ...
    file: str
    line: int  # 0: the file as a whole
    what: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.what} ({self.kind})"


def inspect(folder: Path) -> list[Finding]:
    """Every finding in the folder, file by file in path order."""
    findings: list[Finding] = []
    for rel in walk(folder):
        findings += inspect_file(rel, folder / rel)
    return findings


def inspect_file(rel: str, path: Path) -> list[Finding]:
    if path.is_symlink():
        return [Finding("link", rel, 0, "a symbolic link, which could point anywhere on the machine")]
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        return [Finding("too-large", rel, 0, f"{size:,} bytes; a skill's file is at most {MAX_FILE_BYTES:,}")]
    return inspect_bytes(rel, path.read_bytes())


def inspect_bytes(rel: str, data: bytes) -> list[Finding]:
    binary = _binary_kind(data)
    if binary is not None:
        kind, what = binary
        if kind == "not-text" and rel.startswith(ASSETS):
            return []  # an image or a font: allowed in assets/
        return [Finding(kind, rel, 0, what)]
    return inspect_text(rel, data.decode("utf-8"))


def inspect_text(rel: str, text: str) -> list[Finding]:
    findings: list[Finding] = []
    for kind, what, pattern in PATTERNS:
        for match in pattern.finditer(_joined(text)):
            line = text.count("\n", 0, match.start()) + 1
            findings.append(Finding(kind, rel, line, f"{what}: {_quote(match.group(0))}"))
            break  # one line per pattern and file is enough to refuse it
    return findings


def _joined(text: str) -> str:
    """Shell line continuations joined, each offset kept (a line is counted in the original):
    `curl ... \\` then `| bash` on the next line is one command."""
    return text.replace("\\\n", "  ")


def _binary_kind(data: bytes) -> tuple[str, str] | None:
    for magic, what in _MAGIC:
        if data.startswith(magic) and (magic != b"MZ" or b"PE\0\0" in data[:1024] or len(data) < 64):
            return "binary", what
    if data.startswith(_7Z):
        return "archive-password", "a 7z archive, which can be password-protected and cannot be read here"
    if data.startswith(_RAR):
        return "archive-password", "a rar archive, which can be password-protected and cannot be read here"
    if data.startswith(_ZIP):
        if _zip_encrypted(data):
            return "archive-password", "a password-protected zip archive (its entries are encrypted)"
        return "archive", "a zip archive, whose content is not checked here"
    if b"\0" in data[:8192]:
        return "not-text", "a file that is not text (allowed only in assets/)"
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return "not-text", "a file that is not UTF-8 text (allowed only in assets/)"
    return None


def _zip_encrypted(data: bytes) -> bool:
    """Whether any local file header of the zip has bit 0 (encrypted) of its general-purpose flag."""
    at = 0
    while (at := data.find(_ZIP, at)) != -1 and at + 8 <= len(data):
        if int.from_bytes(data[at + 6 : at + 8], "little") & 1:
            return True
        at += 4
    return False


def _quote(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= 80 else flat[:77] + "..."
