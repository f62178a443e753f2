"""Real programs on BenchFS, as a new user runs them: one cluster started with
`benchfs start --servers 2 --mount DIR`, used through the mount ("mount"), through the
interposition library with a prefix no mount serves ("preload"), and through the library at
the mount point, which hands mapping and exec to the mount ("preload-mount"). Each program
runs the same script in a local directory and in BenchFS, and the two outputs must agree (the
root's name taken out): tar, git, rsync and a Python venv in `make test`; an autotools build
and a wheel installed into a venv under test-long. docs/programs.md holds the program x face
table these tests keep true."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from benchfs.config import with_overrides
from benchfs.mount import mounted
from benchfs.native import preload_env
from test_lifecycle import BIN, exports
from test_preload import own_env

# A tree with what software trees hold: nested directories, sizes around a chunk, an
# executable script, and links relative, dangling, to a directory and to a host path.
TREE = r"""
mkdir -p "$1/src/pkg/deep" "$1/data"
printf 'hello\n' > "$1/README"
head -c 1048583 /dev/zero | tr '\0' 'x' > "$1/data/big.bin"
seq 1 20000 > "$1/data/numbers.txt"
: > "$1/data/empty"
printf '#!/bin/sh\necho run\n' > "$1/src/run.sh" && chmod 755 "$1/src/run.sh"
for i in 1 2 3; do printf 'int f%s(void) { return %s; }\n' $i $i > "$1/src/pkg/f$i.c"; done
ln -s ../README "$1/src/readme-link"
ln -s pkg "$1/src/pkg-link"
ln -s nowhere "$1/src/dangling"
ln -s /etc/hostname "$1/host-link"
find "$1" -exec touch -h -d '2024-01-02 03:04:05' {} +
"""

# Prints what a tree holds, sorted: path, type, size of files, mode, link target; and the
# checksum of every file.
LISTING = r"""
listing() {
  (cd "$1" && find . -path ./.git -prune -o -printf '%P %y %s %m %l\n' |
     sed 's/ d [0-9]* / d - /' | sort
   find . -path ./.git -prune -o -type f -print0 | sort -z | xargs -0 -r md5sum)
}
"""

PROGRAMS = {
    "tar": r"""
tar -C "$SRC" -czf "$OUT/tree.tgz" .
mkdir "$R/untar"
tar -C "$R/untar" -xzf "$OUT/tree.tgz"
listing "$R/untar"
tar -C "$R/untar" -cf - . | tar -tvf - | awk '{print $1, $3, $6, $7, $8}' | sort
""",
    "git": r"""
export GIT_AUTHOR_NAME=t GIT_AUTHOR_EMAIL=t@example.org GIT_COMMITTER_NAME=t
export GIT_COMMITTER_EMAIL=t@example.org GIT_AUTHOR_DATE='2024-01-02T03:04:05Z'
export GIT_COMMITTER_DATE='2024-01-02T03:04:05Z' GIT_CONFIG_NOSYSTEM=1 HOME="$OUT"
git init -q -b main "$R/repo"
cp -a "$SRC/." "$R/repo/"
cd "$R/repo"
git add -A && git commit -qm one
echo more >> README && git mv data/numbers.txt data/renamed.txt && git commit -qam two
git gc -q && git fsck --full --strict && git count-objects -v | grep -E '^(count|in-pack|packs)'
git log --format='%H %s'
git clone -q "$R/repo" "$R/clone"
git -C "$R/clone" log --format='%H %s' && git -C "$R/clone" status --porcelain
listing "$R/clone"
""",
    # git's whole cycle on a few hundred files: gc maps the index that the commit just before
    # rewrote with its trees added (through the library, the mapping is the mount's). With 250
    # names in 25 directories the trees take the index past a page boundary, so a mount
    # kernel that kept the old size faults (SIGBUS, as pack-objects did before the fix).
    "git-gc": r"""
export GIT_AUTHOR_NAME=t GIT_AUTHOR_EMAIL=t@example.org GIT_COMMITTER_NAME=t
export GIT_COMMITTER_EMAIL=t@example.org GIT_AUTHOR_DATE='2024-01-02T03:04:05Z'
export GIT_COMMITTER_DATE='2024-01-02T03:04:05Z' GIT_CONFIG_NOSYSTEM=1 HOME="$OUT"
git init -q -b main "$R/big"
cd "$R/big"
for d in $(seq -w 1 25); do
  mkdir -p "mod$d"
  for f in $(seq -w 1 10); do
    for l in $(seq 1 $((10#$f * 9 + 10#$d))); do
      echo "int f${d}_${f}_$l(int x) { return x + $l; }"
    done > "mod$d/file$f.c"
  done
done
git add -A && git commit -qm one && git gc -q
for d in 01 05 09; do seq 1 $((10#$d * 300)) >> "mod$d/file03.c"; done
git rm -q -r mod12 mod17 && git commit -qam two && git repack -q -a -d
cp -r mod01 mod26 && git add mod26 && git commit -qm three && git gc -q --aggressive
git fsck --full --strict && git count-objects -v | grep -E '^(count|in-pack|packs)'
git log --format='%H %s'
git ls-files | wc -l
git archive HEAD | md5sum
""",
    "rsync": r"""
rsync -a "$SRC/" "$R/rs/"
rsync -a "$R/rs/" "$OUT/back/"
diff -r --no-dereference "$SRC" "$OUT/back" && echo same
times() { (cd "$1" && find . ! -type l -printf '%P %m %TY-%Tm-%Td %TH:%TM:%TS\n' | sort); }
diff <(times "$SRC") <(times "$OUT/back")
echo changed > "$SRC/data/new.txt"
rsync -ai --delete "$SRC/" "$R/rs/" | awk '{print $1, $2}' | sort
rm "$SRC/data/new.txt"
listing "$R/rs"
""",
    # Through the interposition library alone a program in BenchFS cannot be executed: the
    # venv is made without pip (ensurepip runs the venv's python) and not run.
    "venv": r"""
if [ "$FACE" = preload ]; then
  "$PYTHON" -m venv --without-pip "$R/venv"
else
  "$PYTHON" -m venv "$R/venv"
  "$R/venv/bin/python" -c 'import sys, os; print(sys.prefix == os.environ["R"] + "/venv")'
  "$R/venv/bin/pip" --version | cut -d' ' -f1
  "$R/venv/bin/pip" list --format=freeze | cut -d= -f1
fi
ls "$R/venv/bin" | grep -v -i activate
cat "$R/venv/pyvenv.cfg" | cut -d= -f1
""",
}


# Under test-long: an autotools build (with libtool) from a source tree with links, run from
# where it was built; and a wheel built and installed into a venv, its console script run.
LONG_PROGRAMS = {
    "autotools": r"""
mkdir -p "$R/proj/src" "$R/proj/include"
cd "$R/proj"
printf '%s\n' 'AC_INIT([greet], [1.0])' 'AM_INIT_AUTOMAKE([foreign subdir-objects])' \
  'AC_PROG_CC' 'LT_INIT' 'AC_CONFIG_FILES([Makefile])' 'AC_OUTPUT' > configure.ac
printf '%s\n' 'lib_LTLIBRARIES = libgreet.la' 'libgreet_la_SOURCES = src/greet.c' \
  'include_HEADERS = include/greet.h' 'bin_PROGRAMS = greet' 'greet_SOURCES = src/main.c' \
  'greet_LDADD = libgreet.la' 'AM_CPPFLAGS = -I$(srcdir)/include' 'TESTS = src/check.sh' \
  > Makefile.am
printf 'const char *greet(void);\n' > src/greet.h
ln -s ../src/greet.h include/greet.h
printf '#include "greet.h"\nconst char *greet(void) { return "hello"; }\n' > src/greet.c
printf '#include <stdio.h>\n#include "greet.h"\n' > src/main.c
printf 'int main(void) { printf("%%s from libtool\\n", greet()); return 0; }\n' >> src/main.c
printf '#!/bin/sh\n./greet | grep -q libtool\n' > src/check.sh && chmod +x src/check.sh
autoreconf -fi > "$OUT/autoreconf.log" 2>&1
./configure --prefix="$R/inst" > "$OUT/configure.log"
make > "$OUT/make.log" 2>&1
make check > "$OUT/check.log" 2>&1 && echo check-passed
make install > "$OUT/install.log" 2>&1
./greet
"$R/inst/bin/greet"
ls "$R/inst/lib" | grep -v '\.la$' | sort
readlink "$R/inst/lib/libgreet.so"
""",
    # The wheel is made by hand (a zip with METADATA, WHEEL, entry points and RECORD): the
    # venv has no `wheel` package to build one with, and the tests are offline.
    "wheel": r"""
"$PYTHON" -m venv "$R/venv"
mkdir -p "$R/dist"
"$R/venv/bin/python" - "$R/dist/hello_bfs-1.0-py3-none-any.whl" <<'EOF'
import base64, hashlib, sys, zipfile
info = "hello_bfs-1.0.dist-info"
files = {
    "hello_bfs/__init__.py": 'def main():\n    print("hello from a wheel")\n',
    f"{info}/METADATA": "Metadata-Version: 2.1\nName: hello-bfs\nVersion: 1.0\n",
    f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
    "Tag: py3-none-any\n",
    f"{info}/entry_points.txt": "[console_scripts]\nhello-bfs = hello_bfs:main\n",
}
def digest(text):
    d = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
    return f"sha256={d},{len(text.encode())}"
record = "".join(f"{name},{digest(text)}\n" for name, text in files.items())
files[f"{info}/RECORD"] = record + f"{info}/RECORD,,\n"
with zipfile.ZipFile(sys.argv[1], "w") as whl:
    for name, text in files.items():
        whl.writestr(name, text)
EOF
ls "$R/dist"
"$R/venv/bin/pip" install -q --no-index "$R"/dist/*.whl
"$R/venv/bin/hello-bfs"
"$R/venv/bin/python" -c 'import hello_bfs; print(hello_bfs.__file__)'
"$R/venv/bin/pip" list --format=freeze | grep hello
""",
}


@dataclass
class Faces:
    """One cluster, seen through a mount and through the interposition library; `other` is
    a second mount of it, as another node's would be."""

    env: dict[str, str]
    mount: Path
    prefix: Path
    other: Path


@pytest.fixture(scope="module")
def faces(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Faces]:
    base = tmp_path_factory.mktemp("programs")
    mount = base / "mnt"
    mount.mkdir()
    env = own_env()
    started = subprocess.run(
        [str(BIN / "benchfs"), "start", "--servers", "2", "--mount", str(mount),
         "--results-root", str(base / "results")],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    env.update(exports(started.stdout))
    other = base / "other"
    other.mkdir()
    try:
        with mounted(env["BENCHFS_REGISTRY"], other, env["BENCHFS_CONFIG"]) as second:
            yield Faces(env, mount, base / "prefix", other)
        assert second.returncode == 0 and second.forced == [], second.output()
    finally:
        stopped = subprocess.run(
            [str(BIN / "benchfs"), "stop"], env=env, capture_output=True, text=True, timeout=120
        )
        assert stopped.returncode == 0, stopped.stderr


def run_in(faces: Faces, where: str, face: str, program: str, tmp_path: Path) -> str:
    """The script of `program` for `face` (FACE in the script), run with R a fresh directory
    `where` (local, or in BenchFS through `face`), SRC a local copy of TREE and OUT local
    scratch; its output with R's name taken out."""
    src, out = tmp_path / f"src-{where}", tmp_path / f"out-{where}"
    out.mkdir()
    subprocess.run(["bash", "-euc", TREE, "tree", str(src)], check=True)
    env = {**faces.env, "SRC": str(src), "OUT": str(out), "PYTHON": sys.executable, "FACE": face}
    if where == "local":
        root = tmp_path / "local"
    elif face == "mount":  # one namespace: /PROGRAM-FACE in BenchFS
        root = faces.mount / f"{program}-{face}"
    elif face == "preload-mount":  # the library's prefix is the mount point, its default
        root = faces.mount / f"{program}-{face}"
        env = preload_env(env, faces.mount)
    else:
        root = faces.prefix / f"{program}-{face}"
        # No mount serves this prefix: the library alone.
        env = preload_env({**env, "BENCHFS_MOUNT": ""}, faces.prefix)
    env["R"] = str(root)
    script = {**PROGRAMS, **LONG_PROGRAMS}[program]
    steps = f'set -euo pipefail\n{LISTING}\nmkdir -p "$R"\n{script}'
    done = subprocess.run(
        ["bash", "-c", steps], env=env, cwd=out, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"{program} through {face}:\n{done.stdout}\n{done.stderr}"
    assert "benchfs-preload" not in done.stderr, done.stderr
    return done.stdout.replace(str(root), "R")


FACES = ("mount", "preload", "preload-mount")

LOCAL_RUNS: dict[tuple[str, bool], str] = {}
"""The output of each program's local run, by (program, run through the library alone)."""


@pytest.mark.parametrize("face", FACES)
@pytest.mark.parametrize("program", sorted(PROGRAMS))
@pytest.mark.timeout(300)
def test_program_agrees_with_a_local_directory(
    faces: Faces, program: str, face: str, tmp_path: Path
) -> None:
    ours = run_in(faces, face, face, program, tmp_path)
    # The scripts differ by face only through FACE=preload: the local run is made once for it
    # and once for the other faces (the same program on the same local disk).
    key = (program, face == "preload")
    if key not in LOCAL_RUNS:
        LOCAL_RUNS[key] = run_in(faces, "local", face, program, tmp_path)
    assert ours == LOCAL_RUNS[key]
    assert ours.strip(), "the script printed nothing to compare"
    if face == "preload":
        assert not faces.prefix.exists() or os.listdir(faces.prefix) == [], (
            "a call reached the local directory under the prefix"
        )


@pytest.mark.long
@pytest.mark.parametrize("face", ["mount", "preload-mount"])
@pytest.mark.parametrize("program", sorted(LONG_PROGRAMS))
@pytest.mark.timeout(900)
def test_long_program_agrees_with_a_local_directory(
    faces: Faces, program: str, face: str, tmp_path: Path
) -> None:
    """These execute programs stored in BenchFS: through a mount, or through the library
    with a mount at its prefix (the library alone cannot; test_exec_... shows how it says so)."""
    ours = run_in(faces, face, face, program, tmp_path)
    local = run_in(faces, "local", face, program, tmp_path)
    assert ours == local
    assert "hello from" in ours


MAPS = r"""
import errno, mmap, os, subprocess, sys
root = sys.argv[1]
p = os.path.join(root, "m.bin")
data = bytes(range(256)) * 64
with open(p, "wb") as f:
    f.write(data)
with open(p, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
    print("read", m[:4].hex(), len(m), m[:] == data)
with open(p, "r+b") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) as m:
    m[0:2] = b"zz"
    print("copy", bytes(m[:3]))
with open(p, "rb") as f:
    print("file", f.read(3))
try:
    with open(p, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        m[0:5] = b"hello"
        m.flush()
    with open(p, "rb") as f:
        print("shared", f.read(5))
except OSError as e:
    print("shared", errno.errorcode[e.errno])
s = os.path.join(root, "run.sh")
with open(s, "w") as f:
    f.write("#!/bin/sh\necho ran $1\n")
os.chmod(s, 0o755)
try:
    print("exec", subprocess.run([s, "x"], stdout=subprocess.PIPE, text=True).stdout.strip())
except OSError as e:
    print("exec", errno.errorcode[e.errno])
"""


# Files the library writes and the mount's kernel maps (docs/preload.md, "With a mount at the
# prefix"): each mapped once, then grown (or replaced by a rename, as git replaces its index)
# through the library, then mapped again; every byte must be there, none may fault.
GROWN_MAPS = r"""
import mmap, os, sys
root, chunk = sys.argv[1], int(sys.argv[2])
page = mmap.PAGESIZE
cases = {
    "inside-a-page": (100, 3000),
    # Kept with its name (`layout.inline_max`, 8 KiB), then grown past it into chunks.
    "across-the-inline-limit": (6000, 12000),
    "across-chunks": (chunk - 10, 2 * chunk + 5000),
    "past-the-old-size": (page, 3 * chunk + 123),
}
def mapped(path):
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        return bytes(m[:])
for name, (first, grown) in cases.items():
    data = os.urandom(grown)
    p = os.path.join(root, name)
    with open(p, "wb") as f:
        f.write(data[:first])
    before = mapped(p) == data[:first]
    with open(p, "ab") as f:
        f.write(data[first:])
    after = mapped(p)
    # Replaced by a rename, its name mapped before: the new file's bytes.
    new = os.urandom(grown + 777)
    with open(p + ".lock", "wb") as f:
        f.write(new)
    os.rename(p + ".lock", p)
    print(name, before, len(after), after == data, mapped(p) == new)
"""


@pytest.mark.parametrize("write_behind", ["0", "32M"])
@pytest.mark.timeout(120)
def test_a_file_the_library_grew_maps_whole_through_the_mount(
    faces: Faces, write_behind: str, tmp_path: Path
) -> None:
    """git's pack-objects died of SIGBUS mapping the index `git add` had just rewritten: the
    mount's kernel still held the old size. The library refreshes it at the hand-over."""
    config = tmp_path / "config.toml"
    config.write_text(
        with_overrides(
            Path(faces.env["BENCHFS_CONFIG"]).read_text(),
            [f"client.write_behind={write_behind}"],
        )
    )
    chunk = int(tomllib.loads(config.read_text())["layout"]["chunk_size"])
    point = tmp_path / "mnt"
    point.mkdir()
    with mounted(faces.env["BENCHFS_REGISTRY"], point, config):
        root = point / f"grown-{write_behind}"
        env = preload_env({**faces.env, "BENCHFS_MOUNT": str(point)}, point)
        done = subprocess.run(
            [sys.executable, "-c", GROWN_MAPS, str(root), str(chunk)],
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
            preexec_fn=lambda: os.makedirs(root, exist_ok=True),
        )
    assert done.returncode == 0, done.stderr
    sizes = {
        "inside-a-page": 3000,
        "across-the-inline-limit": 12000,
        "across-chunks": 2 * chunk + 5000,
    }
    sizes["past-the-old-size"] = 3 * chunk + 123
    assert done.stdout.split("\n")[:-1] == [
        f"{name} True {size} True True" for name, size in sizes.items()
    ], done.stdout


@pytest.mark.parametrize("face", ["preload", "preload-mount"])
@pytest.mark.timeout(120)
def test_mapping_and_exec_through_the_library(faces: Faces, face: str, tmp_path: Path) -> None:
    """Read-only and private mappings everywhere; a shared writable mapping and exec through
    the mount at the prefix, and refused in one line each without one."""
    if face == "preload":
        root, env = (
            faces.prefix / "maps",
            preload_env({**faces.env, "BENCHFS_MOUNT": ""}, faces.prefix),
        )
    else:
        root, env = faces.mount / "maps", preload_env(faces.env, faces.mount)
    script = f"mkdir -p {root} && {sys.executable} -c '{MAPS}' {root}"
    done = subprocess.run(
        ["bash", "-c", script], env=env, capture_output=True, text=True, timeout=100
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[:3] == ["read 00010203 16384 True", "copy b'zz\\x02'", "file b'\\x00\\x01\\x02'"]
    if face == "preload-mount":
        assert lines[3:] == ["shared b'hello'", "exec ran x"], done.stdout
        assert "benchfs-preload" not in done.stderr
    else:
        assert lines[3:] == ["shared ENODEV", "exec EACCES"], done.stdout
        said = [line for line in done.stderr.splitlines() if line.startswith("benchfs-preload")]
        assert len(said) == 2 and "needs BenchFS mounted at the prefix" in said[0], said
        assert "cannot execute" in said[1] and "benchfs start --mount" in said[1], said


LOCKS = r"""
import fcntl, os, struct, subprocess, sys, time
root = sys.argv[1]
os.makedirs(root, exist_ok=True)
p = os.path.join(root, "locked")
# The other process's path to the same file: through another mount, if given.
q = os.path.join(sys.argv[2], "locked") if sys.argv[2:] and sys.argv[2] else p
with open(p, "wb") as f:
    f.write(b"x" * 100)
other = r'''
import fcntl, os, struct, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
for how in ("lockf", "flock"):
    try:
        (fcntl.lockf if how == "lockf" else fcntl.flock)(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        print(how, "taken")
    except OSError as e:
        print(how, "refused", e.errno)
got = fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack("hhqqi", fcntl.F_WRLCK, 0, 0, 0, 0))
kind, _, start, length, pid = struct.unpack("hhqqi", got)
print("getlk", kind == fcntl.F_WRLCK, start, length, pid == int(sys.argv[2]))
sys.stdout.flush()
t0 = time.monotonic()
fcntl.lockf(fd, fcntl.LOCK_EX)
print("waited", time.monotonic() - t0 > 0.3)
'''
fd = os.open(p, os.O_RDWR)
fcntl.lockf(fd, fcntl.LOCK_EX, 10, 5)
fd2 = os.open(p, os.O_RDWR)
fcntl.flock(fd2, fcntl.LOCK_SH)
child = subprocess.Popen(
    [sys.executable, "-c", other, q, str(os.getpid())], stdout=subprocess.PIPE, text=True
)
for _ in range(3):
    print(child.stdout.readline().strip())
time.sleep(0.5)
os.close(fd)  # releases this process's record locks on the file
print(child.stdout.readline().strip())
child.wait()
os.close(fd2)
"""


@pytest.mark.parametrize("face", ["preload", "preload-mount", "mount"])
@pytest.mark.timeout(120)
def test_locks_between_two_processes(faces: Faces, face: str) -> None:
    """fcntl record locks, lockf, flock and F_GETLK between two processes, as on one local
    file: a conflict refused, its holder named, a wait ended by the holder's close. Through
    the mount the other process works through a second mount (another node's, as far as
    the kernel knows), so only BenchFS's locks can keep them apart; flock is the kernel's
    there (node-local), so it is not refused across the two mounts."""
    other = ""
    if face == "preload":
        env = preload_env({**faces.env, "BENCHFS_MOUNT": ""}, faces.prefix)
        root = faces.prefix / "locks"
    elif face == "preload-mount":
        env = preload_env(faces.env, faces.mount)
        root = faces.mount / "locks-pm"
    else:
        env, root, other = faces.env, faces.mount / "locks-m", str(faces.other / "locks-m")
    done = subprocess.run(
        [sys.executable, "-c", LOCKS, str(root), other],
        env=env, capture_output=True, text=True, timeout=100,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        "lockf refused 11",
        "flock taken" if face == "mount" else "flock refused 11",
        "getlk True 5 10 True",
        "waited True",
    ], done.stdout + done.stderr


SQLITE_WRITER = r"""
db=$1; who=$2; n=$3
for i in $(seq 1 "$n"); do echo "insert into t values ($who, $i);"; done > "$OUT/ins-$who.sql"
sqlite3 -cmd ".timeout 60000" "$db" < "$OUT/ins-$who.sql"
"""


@pytest.mark.parametrize("face", ["preload", "preload-mount", "mount"])
@pytest.mark.timeout(180)
def test_two_sqlite_writers_share_one_database(faces: Faces, face: str, tmp_path: Path) -> None:
    """Two sqlite3 processes insert into one database at once, each row its own transaction:
    every row is there and the database checks. Through the mount, the second writer works
    through the second mount: only the job's locks keep them apart."""
    env = {**faces.env, "OUT": str(tmp_path)}
    if face == "preload":
        env = preload_env({**env, "BENCHFS_MOUNT": ""}, faces.prefix)
        root = faces.prefix / "sqlite"
    elif face == "preload-mount":
        env = preload_env(env, faces.mount)
        root = faces.mount / "sqlite-pm"
    else:
        root = faces.mount / "sqlite-m"
    writer = tmp_path / "writer.sh"
    writer.write_text(SQLITE_WRITER)
    db = f"{root}/rows.db"
    db2 = f"{faces.other}/sqlite-m/rows.db" if face == "mount" else db
    script = (
        f'mkdir -p {root} && sqlite3 {db} "create table t(who, i);" && '
        f"(bash {writer} {db} 1 300 & bash {writer} {db2} 2 300 & wait) && "
        f'sqlite3 {db} "select who, count(distinct i) from t group by who; pragma integrity_check;"'
    )
    done = subprocess.run(
        ["bash", "-c", script], env=env, capture_output=True, text=True, timeout=170
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split() == ["1|300", "2|300", "ok"], done.stdout + done.stderr


H5PY = r"""
import subprocess, sys
import h5py, numpy as np
path = sys.argv[1]
data = np.arange(1_000_000, dtype="f8").reshape(1000, 1000)
SECOND = "import h5py, sys; h5py.File(sys.argv[1], 'a', locking=True)"
with h5py.File(path, "w", locking=True) as f:
    f.create_dataset("x", data=data, chunks=(100, 1000))
    f["x"].attrs["note"] = "benchfs"
    f.flush()
    # Another process that wants to write is refused while this one holds the file.
    second = subprocess.run([sys.executable, "-c", SECOND, path], capture_output=True, text=True)
    print("second writer", "refused" if "unable to lock file" in second.stderr else second.stderr)
with h5py.File(path, "r", locking=True) as f:
    print("read", f["x"].shape, bool((f["x"][:] == data).all()), f["x"].attrs["note"])
with h5py.File(path, "a", locking=True) as f:  # the lock went with the first writer's close
    f["x"][0, 0] = -1.0
    print("appended", f["x"][0, :2])
"""


@pytest.mark.long
@pytest.mark.parametrize("face", FACES)
@pytest.mark.timeout(300)
def test_h5py_with_file_locking(faces: Faces, face: str, tmp_path: Path) -> None:
    """h5py writes and reads a dataset with HDF5's file locking on (flock): a second writer is
    refused while the first holds the file, and admitted after its close."""
    env = {**faces.env}
    if face == "preload":
        env = preload_env({**env, "BENCHFS_MOUNT": ""}, faces.prefix)
        root = faces.prefix
    elif face == "preload-mount":
        env = preload_env(env, faces.mount)
        root = faces.mount
    else:
        root = faces.mount
    script = tmp_path / "h5.py"
    script.write_text(H5PY)
    done = subprocess.run(
        [sys.executable, str(script), f"{root}/h5-{face}.h5"],
        env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        "second writer refused",
        "read (1000, 1000) True benchfs",
        "appended [-1.  1.]",
    ], done.stdout + done.stderr
    # The file is BenchFS's (seen through the mount), not a local one under the prefix.
    assert (faces.mount / f"h5-{face}.h5").stat().st_size > 8_000_000
    assert not (faces.prefix / f"h5-{face}.h5").exists()
