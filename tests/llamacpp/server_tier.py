"""The llama-server tier: llama.cpp's own HTTP server, built from the llama.cpp source that the
pinned llama-cpp-python sdist on PyPI vendors (tests/llamacpp/server.py pins it), so the source
comes from a registry and is the same llama.cpp the llama-cpp-python tier runs.

It serves Chat Completions (`/v1/chat/completions`), the Anthropic Messages API (`/v1/messages`)
and the OpenAI Responses API (`/v1/responses`) from one process. Built once outside the clone and
reused while the pins stay the same: `$GATEWAY_TEST_LLAMA_SERVER`, default
`~/.cache/gateway-tests/llama-server-<LLAMA_CPP_PYTHON>-<GGUF>/`, holding

    bin/llama-server        the server, linked statically (only its target is built)
    py/bin/python           a venv with `gguf`, which writes the tiny test model (tiny_model.py)

`.ci/run` builds it (`python3 tests/llamacpp/server_tier.py build`, standard library only, so the
system Python runs it before the project is installed): about 18 minutes of CPU (unoptimised, 192
objects), so ~10 minutes on two free cores, at nice 10. Tests call `unavailable_reason()` and skip
with it when the tier is missing.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
MARKER = ".built"  # written last: a tier without it is a build that did not finish
CMAKE_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    # Unoptimised: the tiny model needs no speed, and -O0 compiles in a fraction of -O3's time.
    "-DCMAKE_C_FLAGS_RELEASE=-O0 -DNDEBUG",
    "-DCMAKE_CXX_FLAGS_RELEASE=-O0 -DNDEBUG",
    "-DGGML_NATIVE=OFF",  # runs on any x86-64 the cache is carried to
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",  # it would download the web UI at build time
    "-DLLAMA_OPENSSL=OFF",
]


def _pin(name: str) -> str:
    """A pin of tests/llamacpp/server.py, read as text: this script runs before the project is installed."""
    found = re.search(rf'^{name} = "([^"]+)"', (HERE / "server.py").read_text(), re.M)
    if found is None:
        raise SystemExit(f"{name} is not pinned in {HERE / 'server.py'}")
    return found.group(1)


def versions() -> tuple[str, str]:
    """(llama-cpp-python, whose sdist vendors the llama.cpp source; gguf, which writes the model)."""
    return _pin("LLAMA_CPP_PYTHON"), _pin("GGUF")


def tier_path() -> Path:
    llama, gguf = versions()
    default = Path.home() / ".cache" / "gateway-tests" / f"llama-server-{llama}-{gguf}"
    return Path(os.environ.get("GATEWAY_TEST_LLAMA_SERVER") or default)


def server_binary() -> Path:
    return tier_path() / "bin" / "llama-server"


def python() -> Path:
    return tier_path() / "py" / "bin" / "python"


def unavailable_reason() -> str | None:
    """Why the tier cannot run here, or None when it can."""
    where = tier_path()
    if not (where / MARKER).exists():
        return (
            f"llama.cpp's llama-server is not built at {where} "
            "(.ci/run builds it: python3 tests/llamacpp/server_tier.py build; or set GATEWAY_TEST_LLAMA_SERVER)"
        )
    missing = [str(p) for p in (server_binary(), python()) if not p.exists()]
    if missing:
        return f"the llama-server tier at {where} lacks {', '.join(missing)} (remove it and build again)"
    return None


def build() -> Path:
    """Build the tier unless it is there. One builder at a time (a lock beside it); the marker is
    written last, so a build cut short is removed and made again."""
    where = tier_path()
    where.parent.mkdir(parents=True, exist_ok=True)
    with open(where.with_name(where.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if unavailable_reason() is None:
            return where
        shutil.rmtree(where, ignore_errors=True)
        where.mkdir()
        llama, gguf = versions()
        run = lambda *cmd, **kw: subprocess.run(cmd, check=True, **kw)  # noqa: E731
        run(sys.executable, "-m", "venv", str(where / "py"))
        pip = str(where / "py" / "bin" / "pip")
        run(pip, "install", "--quiet", "--upgrade", "pip")
        run(pip, "install", "--quiet", f"gguf=={gguf}")
        work = where / "work"
        wanted = f"llama-cpp-python=={llama}"
        run(pip, "download", "--quiet", "--no-deps", "--no-binary", ":all:", "-d", str(work), wanted)
        (sdist,) = work.glob("llama_cpp_python-*.tar.gz")
        with tarfile.open(sdist) as archive:
            archive.extractall(work, filter="data")
        (source,) = work.glob("llama_cpp_python-*/vendor/llama.cpp")
        nice = ["nice", "-n", "10"]
        jobs = str(min(2, os.cpu_count() or 1))
        run(*nice, "cmake", "-S", str(source), "-B", str(work / "build"), "-G", _generator(), *CMAKE_FLAGS,
            stdout=subprocess.DEVNULL)
        run(*nice, "cmake", "--build", str(work / "build"), "--target", "llama-server", "-j", jobs,
            stdout=subprocess.DEVNULL)
        (where / "bin").mkdir()
        shutil.copy2(work / "build" / "bin" / "llama-server", server_binary())
        shutil.rmtree(work)
        (where / MARKER).write_text(f"llama-cpp-python=={llama} (vendored llama.cpp)\ngguf=={gguf}\n")
    return where


def _generator() -> str:
    return "Ninja" if shutil.which("ninja") else "Unix Makefiles"


if __name__ == "__main__":
    command = sys.argv[1] if len(sys.argv) > 1 else "build"
    if command == "path":
        print(tier_path())
    elif command == "build":
        print(build())
    else:
        sys.exit(f"usage: {sys.argv[0]} [build|path]")
