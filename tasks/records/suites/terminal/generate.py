"""Writes the task folders of the built-in terminal suite (this folder) from seeded data.

Run from the repository root: ``python tasks/records/suites/terminal/generate.py [OUT] [--no-lists]``
(OUT: where the task folders go, default this folder; ``--no-lists``: skip the fail-to-pass /
pass-to-pass lists, which need bwrap sandboxes; ``tests/records/test_terminal_generator.py`` writes
into a temporary folder that way and compares with the committed folders byte for byte). Every input is
drawn from ``random.Random(<task number>)``, so a rerun writes byte-identical files; the expected
values in each ``tests/test_outputs.py`` are computed here from the same data (the tests never
recompute them from /app, which the agent could edit). Most tasks use the Terminal-Bench 1 layout
(task.yaml, workspace/, tests/, solution.sh, Dockerfile); ``users-json-transform``, ``join-csv``,
``split-log-by-date``, ``jsonl-errors`` and ``checksum-manifest`` use the TB2/Harbor layout
(instruction.md, task.toml, environment/, tests/, solution/solve.sh). Oracle solutions use only
bash, coreutils, findutils, grep, sed, tar, gzip and python3 (no awk, bc, perl or jq: the sandbox
images need not have them).
"""
import json, os, random, sys, textwrap
from pathlib import Path
HERE = Path(__file__).resolve().parent
_ARGS = [a for a in sys.argv[1:] if a != "--no-lists"]
ROOT = Path(_ARGS[0]).resolve() if _ARGS else HERE

def w(path, text, mode=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8", newline="")

def tb1(name, instruction, files, tests, solution, *, difficulty="easy", category="file-operations", tags=()):
    d = ROOT / name
    y = {"instruction": instruction.strip() + "\n", "author_name": "harnessrl", "author_email": "unknown",
         "difficulty": difficulty, "category": category, "tags": list(tags), "parser_name": "pytest",
         "max_agent_timeout_sec": 300.0, "max_test_timeout_sec": 30.0, "run_tests_in_same_shell": False}
    import yaml
    w(d / "task.yaml", yaml.safe_dump(y, sort_keys=False, allow_unicode=True, width=100))
    w(d / "Dockerfile", "FROM python:3.11-slim\nWORKDIR /app\nCOPY workspace/ /app/\n")
    for rel, text in files.items():
        w(d / "workspace" / rel, text)
    w(d / "tests" / "test_outputs.py", textwrap.dedent(tests).lstrip())
    w(d / "solution.sh", "#!/bin/bash\nset -euo pipefail\ncd /app\n" + textwrap.dedent(solution).lstrip())

def tb2(name, instruction, files, tests, solution, *, difficulty="easy", category="data-processing", tags=()):
    d = ROOT / name
    toml = (f'version = "1.0"\n\n[metadata]\nauthor_name = "harnessrl"\nauthor_email = "unknown"\n'
            f'difficulty = "{difficulty}"\ncategory = "{category}"\ntags = {json.dumps(list(tags))}\n\n'
            '[verifier]\ntimeout_sec = 30.0\n\n[agent]\ntimeout_sec = 300.0\n\n'
            '[environment]\nbuild_timeout_sec = 600.0\ncpus = 1\nmemory_mb = 512\nstorage_mb = 1024\n'
            'allow_internet = false\n')
    w(d / "task.toml", toml)
    w(d / "instruction.md", instruction.strip() + "\n")
    w(d / "environment" / "Dockerfile", "FROM python:3.11-slim\nWORKDIR /app\nCOPY . /app/\n")
    for rel, text in files.items():
        w(d / "environment" / rel, text)
    w(d / "tests" / "test.sh", "#!/bin/bash\n# Harbor entry point; harnessrl runs the pytest files directly.\n"
      "cd /app\npytest /tests/test_outputs.py -rA\nif [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; "
      "else echo 0 > /logs/verifier/reward.txt; fi\n")
    w(d / "tests" / "test_outputs.py", textwrap.dedent(tests).lstrip())
    w(d / "solution" / "solve.sh", "#!/bin/bash\nset -euo pipefail\ncd /app\n" + textwrap.dedent(solution).lstrip())

from collections import Counter
import csv, io, hashlib, re

# 1 log-level-report ---------------------------------------------------------------------------
rng = random.Random(1)
levels = ["INFO"] * 9 + ["WARN"] * 4 + ["ERROR"] * 3 + ["DEBUG"] * 5
comps = ["api", "db", "auth", "cache", "worker"]
lines = []
for i in range(240):
    lv = rng.choice(levels)
    lines.append(f"2024-03-{1 + i // 20:02d}T{i % 24:02d}:{(i * 7) % 60:02d}:00 {lv} {rng.choice(comps)}: event {i}")
lines.insert(50, "")
lines.insert(120, "   ")
log = "\n".join(lines) + "\n"
cnt = Counter(l.split()[1] for l in lines if l.strip())
order = sorted(cnt.items(), key=lambda kv: (-kv[1], kv[0]))
err_comp = Counter(l.split()[2].rstrip(":") for l in lines if l.strip() and l.split()[1] == "ERROR")
top_comp = sorted(err_comp.items(), key=lambda kv: (-kv[1], kv[0]))[0]
tb1("log-level-report", f"""
The application log /app/logs/app.log has one event per line: `<timestamp> <LEVEL> <component>: <message>`
(some lines are blank). Write /app/report.txt with one line per log level, `<LEVEL> <count>`, sorted by
count (highest first; ties by level name). Then write /app/top_error_component.txt containing just the
name of the component with the most ERROR events (ties: alphabetically first).
""", {"logs/app.log": log}, f"""
from pathlib import Path

EXPECTED = {order!r}


def lines():
    return Path("/app/report.txt").read_text().strip().splitlines()


def test_report_exists():
    assert Path("/app/report.txt").is_file()


def test_error_count():
    assert "ERROR {cnt['ERROR']}" in lines()


def test_all_levels_counted():
    got = dict(l.split() for l in lines())
    assert {{k: int(v) for k, v in got.items()}} == dict(EXPECTED)


def test_sorted_by_count():
    assert lines() == [f"{{k}} {{v}}" for k, v in EXPECTED]


def test_top_error_component():
    assert Path("/app/top_error_component.txt").read_text().strip() == {top_comp[0]!r}
""", """
grep -v '^[[:space:]]*$' logs/app.log | cut -d' ' -f2 | sort | uniq -c | sort -k1,1nr -k2,2 \\
  | sed -E 's/^ *([0-9]+) (.*)$/\\2 \\1/' > report.txt
grep -E '^[^ ]+ ERROR ' logs/app.log | cut -d' ' -f3 | tr -d ':' | sort | uniq -c | sort -k1,1nr -k2,2 \\
  | head -n1 | sed -E 's/^ *[0-9]+ //' > top_error_component.txt
""", tags=["logs", "sort", "uniq"], category="log-analysis")

# 2 csv-revenue-summary ------------------------------------------------------------------------
rng = random.Random(2)
rows = [("region", "product", "qty", "unit_price")]
for i in range(60):
    rows.append((rng.choice(["north", "south", "east", "west", "central"]), rng.choice(["widget", "gadget", "doohickey"]),
                 str(rng.randint(1, 20)), f"{rng.randint(100, 5000) / 100:.2f}"))
buf = io.StringIO(); csv.writer(buf, lineterminator="\n").writerows(rows)
rev = {}
units = {}
for r, p, q, u in rows[1:]:
    rev[r] = rev.get(r, 0) + int(q) * float(u)
    units[r] = units.get(r, 0) + int(q)
expected = [(r, f"{rev[r]:.2f}", units[r]) for r in sorted(rev)]
tb1("csv-revenue-summary", """
/app/sales.csv lists sales with the columns region, product, qty, unit_price. Write /app/summary.csv with
the header `region,revenue,units` and one row per region, sorted by region name, where revenue is the sum of
qty * unit_price over that region's rows, printed with exactly two decimals, and units is the sum of qty.
""", {"sales.csv": buf.getvalue()}, f"""
import csv
from pathlib import Path

EXPECTED = {expected!r}


def rows():
    with open("/app/summary.csv", newline="") as f:
        return list(csv.reader(f))


def test_header():
    assert rows()[0] == ["region", "revenue", "units"]


def test_one_row_per_region_sorted():
    assert [r[0] for r in rows()[1:]] == [e[0] for e in EXPECTED]


def test_revenue():
    assert [r[1] for r in rows()[1:]] == [e[1] for e in EXPECTED]


def test_units():
    assert [int(r[2]) for r in rows()[1:]] == [e[2] for e in EXPECTED]
""", """
python3 - <<'PY'
import csv
rev, units = {}, {}
with open("sales.csv", newline="") as f:
    for row in csv.DictReader(f):
        r = row["region"]
        rev[r] = rev.get(r, 0) + int(row["qty"]) * float(row["unit_price"])
        units[r] = units.get(r, 0) + int(row["qty"])
with open("summary.csv", "w", newline="") as f:
    w = csv.writer(f, lineterminator="\\n")
    w.writerow(["region", "revenue", "units"])
    for r in sorted(rev):
        w.writerow([r, f"{rev[r]:.2f}", units[r]])
PY
""", tags=["csv"], category="data-processing")

# 3 rename-photos ----------------------------------------------------------------------------
rng = random.Random(3)
files = {}
mapping = {}
days = ["20230105", "20230105", "20230105", "20230212", "20230212", "20221231", "20230301", "20230301"]
counters = {}
for d in days:
    counters[d] = counters.get(d, 0) + 1
    old = f"photos/IMG_{d}_{counters[d]}.jpg"
    files[old] = f"jpeg-bytes-{d}-{counters[d]}-{rng.randint(0, 10**6)}\n"
    mapping[old] = f"photos/{d[:4]}-{d[4:6]}-{d[6:]}_{counters[d]:03d}.jpg"
files["photos/notes.txt"] = "keep me as I am\n"
expected = {v.split('/')[1]: files[k] for k, v in mapping.items()}
tb1("rename-photos", """
The folder /app/photos holds camera files named `IMG_<YYYYMMDD>_<n>.jpg`. Rename every such file to
`<YYYY>-<MM>-<DD>_<nnn>.jpg`, where nnn is n zero-padded to three digits (for example IMG_20230105_2.jpg
becomes 2023-01-05_002.jpg). Keep them in /app/photos, do not change their contents, and leave any other
file in the folder alone.
""", files, f"""
from pathlib import Path

EXPECTED = {expected!r}
PHOTOS = Path("/app/photos")


def test_no_old_names_left():
    assert PHOTOS.is_dir() and not list(PHOTOS.glob("IMG_*"))


def test_new_names_exist():
    assert sorted(p.name for p in PHOTOS.glob("*.jpg")) == sorted(EXPECTED)


def test_contents_kept():
    for name, text in EXPECTED.items():
        assert (PHOTOS / name).read_text() == text


def test_other_files_untouched():
    assert (PHOTOS / "notes.txt").read_text() == "keep me as I am\\n"
""", """
cd photos
for f in IMG_*_*.jpg; do
  d=${f#IMG_}; d=${d%%_*}
  n=${f##*_}; n=${n%.jpg}
  mv -- "$f" "$(printf '%s-%s-%s_%03d.jpg' "${d:0:4}" "${d:4:2}" "${d:6:2}" "$n")"
done
""", tags=["bash", "rename"])

# 4 find-duplicates ----------------------------------------------------------------------------
rng = random.Random(4)
blobs = [f"content block {i}\n" * rng.randint(1, 5) for i in range(6)]
files = {}
layout = [("a/report.txt", 0), ("b/report-copy.txt", 0), ("c/deep/x.txt", 0), ("a/notes.md", 1), ("b/other.md", 2),
          ("c/notes-old.md", 1), ("d/unique.txt", 3), ("d/data.csv", 4), ("a/data-backup.csv", 4), ("e/lonely.txt", 5)]
for p, b in layout:
    files[f"data/{p}"] = blobs[b]
groups = {}
for p, b in layout:
    groups.setdefault(b, []).append(p)
dup_lines = sorted(" ".join(sorted(g)) for g in groups.values() if len(g) > 1)
tb1("find-duplicates", """
Find the files under /app/data that have identical contents (use a checksum such as sha256sum). Write
/app/duplicates.txt with one line per group of identical files (groups of two or more only): the paths of the
group relative to /app/data, sorted and separated by single spaces. Sort the lines. Then delete every
duplicate except the first path of each group, so that each content is kept exactly once.
""", files, f"""
from pathlib import Path

GROUPS = {dup_lines!r}
DATA = Path("/app/data")


def test_duplicates_file():
    assert Path("/app/duplicates.txt").read_text().splitlines() == GROUPS


def test_first_of_each_group_kept():
    for g in GROUPS:
        assert (DATA / g.split()[0]).is_file()


def test_other_copies_deleted():
    for g in GROUPS:
        for p in g.split()[1:]:
            assert not (DATA / p).exists(), p


def test_unique_files_kept():
    assert (DATA / "d/unique.txt").is_file() and (DATA / "e/lonely.txt").is_file()
""", """
cd data
find . -type f -exec sha256sum {} + | sed 's#  \\./#  #' | sort -k1,1 -k2,2 > /tmp/sums
python3 - <<'PY' > ../duplicates.txt
groups = {}
for line in open("/tmp/sums"):
    h, p = line.rstrip("\\n").split("  ", 1)
    groups.setdefault(h, []).append(p)
print("\\n".join(sorted(" ".join(sorted(g)) for g in groups.values() if len(g) > 1)))
PY
while read -r first rest; do
  for p in $rest; do rm -f -- "$p"; done
done < ../duplicates.txt
""", tags=["checksum", "find"], difficulty="medium")

# 5 top-ips ------------------------------------------------------------------------------------
rng = random.Random(5)
ips = [f"10.0.{rng.randint(0, 3)}.{rng.randint(1, 30)}" for _ in range(25)]
weights = [rng.randint(1, 40) for _ in ips]
lines = []
for i in range(400):
    ip = rng.choices(ips, weights)[0]
    path = rng.choice(["/", "/login", "/api/items", "/static/app.js", "/health"])
    code = rng.choice([200, 200, 200, 304, 404, 500])
    lines.append(f'{ip} - - [12/Mar/2024:10:{i % 60:02d}:{(i * 13) % 60:02d} +0000] "GET {path} HTTP/1.1" {code} {rng.randint(100, 9000)}')
c = Counter(l.split()[0] for l in lines)
top = sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))[:5]
c404 = Counter(l.split()[0] for l in lines if l.split()[8] == "404")
n404 = sum(c404.values())
tb1("top-ips", """
/app/access.log is a web server access log in the common log format. Write /app/top_ips.txt with the five IP
addresses that made the most requests, one per line as `<count> <ip>`, most requests first (ties: compare the
IP strings). Also write /app/not_found_count.txt containing only the number of requests answered with status
404.
""", {"access.log": "\n".join(lines) + "\n"}, f"""
from pathlib import Path

TOP = {top!r}


def top_lines():
    return Path("/app/top_ips.txt").read_text().strip().splitlines()


def test_five_lines():
    assert len(top_lines()) == 5


def test_top_ip():
    assert top_lines()[0].split() == [str(TOP[0][1]), TOP[0][0]]


def test_all_five_in_order():
    assert [l.split() for l in top_lines()] == [[str(n), ip] for ip, n in TOP]


def test_404_count():
    assert Path("/app/not_found_count.txt").read_text().strip() == "{n404}"
""", """
cut -d' ' -f1 access.log | sort | uniq -c | sort -k1,1nr -k2,2 | head -n5 | sed -E 's/^ +//' > top_ips.txt
cut -d' ' -f9 access.log | grep -cx 404 > not_found_count.txt
""", tags=["logs", "sort", "uniq"], category="log-analysis")

# 6 backup-archive -----------------------------------------------------------------------------
files = {
    "project/README.md": "# demo project\n",
    "project/src/main.py": "print('hello')\n",
    "project/src/util.py": "def add(a, b):\n    return a + b\n",
    "project/src/cache.tmp": "scratch\n",
    "project/build/out.tmp": "scratch 2\n",
    "project/docs/guide.md": "guide\n" * 20,
    "project/.env.tmp": "SECRET=1\n",
}
keep = sorted(k for k in files if not k.endswith(".tmp"))
tb1("backup-archive", """
Create a gzip-compressed tar archive /app/backup.tar.gz of the folder /app/project. The archive's member paths
must start with `project/` (for example project/src/main.py). Leave out every file whose name ends in `.tmp`.
Afterwards write the sorted list of regular files in the archive, one path per line, to /app/backup.list.
""", files, f"""
import tarfile
from pathlib import Path

KEEP = {keep!r}
CONTENT = {{k: v for k, v in {files!r}.items() if k in KEEP}}


def members():
    with tarfile.open("/app/backup.tar.gz", "r:gz") as t:
        return {{m.name.removeprefix("./"): t.extractfile(m).read().decode() for m in t.getmembers() if m.isfile()}}


def test_is_gzip_tar():
    assert Path("/app/backup.tar.gz").read_bytes()[:2] == b"\\x1f\\x8b"
    assert tarfile.is_tarfile("/app/backup.tar.gz")


def test_contains_all_kept_files():
    assert set(KEEP) <= set(members())


def test_no_tmp_files():
    assert not [m for m in members() if m.endswith(".tmp")]


def test_contents_match():
    m = members()
    assert all(m.get(k) == v for k, v in CONTENT.items())


def test_list_file():
    assert Path("/app/backup.list").read_text().splitlines() == KEEP
""", """
tar --exclude='*.tmp' -czf backup.tar.gz project
tar -tzf backup.tar.gz | grep -v '/$' | sort > backup.list
""", tags=["tar", "gzip"])

# 7 edit-config-ini ----------------------------------------------------------------------------
ini = """; service configuration
[server]
host = 0.0.0.0
port = 8000
debug = true
#max_connections = 100

[database]
host = db.internal
port = 5432
debug = true

[logging]
level = info
"""
tb1("edit-config-ini", """
Edit /app/config.ini in place: in the [server] section set `port = 8080` and `debug = false`, and enable the
commented-out line `#max_connections = 100` as `max_connections = 250`. In the [logging] section set
`level = warning`. Every other line (including the [database] section, whose port and debug must stay as they
are) must remain unchanged.
""", {"config.ini": ini}, r"""
import configparser
from pathlib import Path


def cfg():
    c = configparser.ConfigParser(comment_prefixes=(";", "#"))
    c.read("/app/config.ini")
    return c


def test_server_port_and_debug():
    c = cfg()
    assert c["server"]["port"] == "8080" and c["server"]["debug"] == "false"


def test_max_connections_enabled():
    assert cfg()["server"]["max_connections"] == "250"


def test_logging_level():
    assert cfg()["logging"]["level"] == "warning"


def test_database_untouched():
    c = cfg()
    assert (c["database"]["port"], c["database"]["debug"], c["database"]["host"]) == ("5432", "true", "db.internal")


def test_other_lines_unchanged():
    lines = Path("/app/config.ini").read_text().splitlines()
    assert lines[0] == "; service configuration" and "host = 0.0.0.0" in lines and len(lines) == 14
""", r"""
sed -i \
  -e '/^\[server\]/,/^\[/{s/^port = .*/port = 8080/;s/^debug = .*/debug = false/;s/^#max_connections = .*/max_connections = 250/}' \
  -e '/^\[logging\]/,/^\[/{s/^level = .*/level = warning/}' config.ini
""", tags=["sed", "config"], category="system-administration")

# 8 fix-permissions ----------------------------------------------------------------------------
files = {
    "scripts/deploy.sh": "#!/bin/sh\necho deploy\n",
    "scripts/backup.sh": "#!/bin/sh\necho backup\n",
    "scripts/README": "how to run the scripts\n",
    "secrets/server.key": "-----KEY-----\n",
    "secrets/client.key": "-----KEY2-----\n",
    "public/index.html": "<h1>hi</h1>\n",
    "public/style.css": "body{}\n",
}
tb1("fix-permissions", """
Fix the file permissions under /app: every `*.sh` file in /app/scripts must be executable (mode 755), the
README in /app/scripts must stay 644, every `*.key` file in /app/secrets must be readable and writable by its
owner only (mode 600), the folder /app/secrets itself must be mode 700, and the files in /app/public must be
mode 644. Then run /app/scripts/deploy.sh and save its output to /app/deploy.out.
""", files, """
import stat
from pathlib import Path


def mode(p):
    return stat.S_IMODE(Path(p).stat().st_mode)


def test_scripts_executable():
    assert mode("/app/scripts/deploy.sh") == 0o755 and mode("/app/scripts/backup.sh") == 0o755


def test_readme_not_executable():
    assert mode("/app/scripts/README") == 0o644


def test_keys_private():
    assert mode("/app/secrets/server.key") == 0o600 and mode("/app/secrets/client.key") == 0o600


def test_secrets_dir_private():
    assert mode("/app/secrets") == 0o700


def test_public_readable():
    assert mode("/app/public/index.html") == 0o644 and mode("/app/public/style.css") == 0o644


def test_deploy_ran():
    assert Path("/app/deploy.out").read_text() == "deploy\\n"
""", """
chmod 755 scripts/*.sh
chmod 644 scripts/README public/*
chmod 600 secrets/*.key
chmod 700 secrets
./scripts/deploy.sh > deploy.out
""", tags=["chmod"], category="system-administration")

# 9 count-lines-tree ---------------------------------------------------------------------------
rng = random.Random(9)
files = {}
tot = {"py": 0, "js": 0}
for i, p in enumerate(["src/app.py", "src/lib/util.py", "src/lib/io.py", "web/main.js", "web/lib/dom.js",
                       "web/lib/net.js", "src/tests/test_app.py", "docs/notes.txt"]):
    n = rng.randint(3, 40)
    files[p] = "".join(f"line {j} of {p}\n" for j in range(n))
    ext = p.rsplit(".", 1)[1]
    if ext in tot:
        tot[ext] += n
files["web/lib/empty.js"] = ""
tb1("count-lines-tree", """
Count the lines of code in the tree under /app (every file whose name ends in `.py` or `.js`, in any
sub-folder). Write /app/loc.txt with exactly three lines: `py <lines in all .py files>`, `js <lines in all
.js files>` and `total <both together>`.
""", files, f"""
from pathlib import Path


def entries():
    return dict(l.split() for l in Path("/app/loc.txt").read_text().strip().splitlines())


def test_three_lines():
    assert len(Path("/app/loc.txt").read_text().strip().splitlines()) == 3


def test_python_lines():
    assert int(entries()["py"]) == {tot['py']}


def test_javascript_lines():
    assert int(entries()["js"]) == {tot['js']}


def test_total():
    assert int(entries()["total"]) == {tot['py'] + tot['js']}
""", """
py=$(find . -type f -name '*.py' -exec cat {} + | wc -l)
js=$(find . -type f -name '*.js' -exec cat {} + | wc -l)
printf 'py %d\\njs %d\\ntotal %d\\n' "$py" "$js" "$((py + js))" > loc.txt
""", tags=["find", "wc"])

# 10 fix-shell-script --------------------------------------------------------------------------
broken = r"""#!/bin/bash
# Copy every .txt file from the folder given as $1 into the folder given as $2, adding the
# suffix .bak to each copy, then print how many files were copied.
src=$1
dst=$2
mkdir -p $dst
count=0
for f in $(ls $src/*.txt); do
  cp $f $dst/$(basename $f).bak
  count=$((count + 1)
done
echo "copied $cout files"
"""
files = {"backup.sh": broken, "in/a.txt": "alpha\n", "in/b c.txt": "file with a space\n", "in/skip.md": "not me\n",
         "in/d.txt": "delta\n"}
tb1("fix-shell-script", """
The script /app/backup.sh is meant to copy every `.txt` file from the folder given as its first argument into
the folder given as its second argument (created if missing), naming each copy `<name>.bak`, and then print
`copied <N> files`. It is broken: it has a syntax error, prints the wrong count, and fails on file names with
spaces. Fix the script in place so that `bash /app/backup.sh <src> <dst>` works for any folders.
""", files, r"""
import shutil
import subprocess
from pathlib import Path


def run(tmp):
    src = tmp / "my src"
    src.mkdir()
    (src / "one.txt").write_text("1\n")
    (src / "two words.txt").write_text("2\n")
    (src / "three.log").write_text("3\n")
    return subprocess.run(["bash", "/app/backup.sh", str(src), str(tmp / "out dir")], capture_output=True, text=True,
                          timeout=10)


def test_syntax_ok():
    assert subprocess.run(["bash", "-n", "/app/backup.sh"]).returncode == 0


def test_runs_and_reports_count(tmp_path):
    r = run(tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "copied 2 files"


def test_copies_with_spaces(tmp_path):
    run(tmp_path)
    out = tmp_path / "out dir"
    assert sorted(p.name for p in out.iterdir()) == ["one.txt.bak", "two words.txt.bak"]
    assert (out / "two words.txt.bak").read_text() == "2\n"


def test_works_on_app_folder(tmp_path):
    r = subprocess.run(["bash", "/app/backup.sh", "/app/in", str(tmp_path / "o")], capture_output=True, text=True,
                       timeout=10)
    assert r.stdout.strip() == "copied 3 files"
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["a.txt.bak", "b c.txt.bak", "d.txt.bak"]
""", r"""
cat > backup.sh <<'SH'
#!/bin/bash
# Copy every .txt file from the folder given as $1 into the folder given as $2, adding the
# suffix .bak to each copy, then print how many files were copied.
src=$1
dst=$2
mkdir -p -- "$dst"
count=0
for f in "$src"/*.txt; do
  [ -e "$f" ] || continue
  cp -- "$f" "$dst/$(basename -- "$f").bak"
  count=$((count + 1))
done
echo "copied $count files"
SH
""", tags=["bash", "debugging"], category="debugging", difficulty="medium")

# 11 fix-python-stats --------------------------------------------------------------------------
broken = '''"""Print count, mean and median of the numbers in a file (one per line; blank lines ignored)."""
import sys


def read_numbers(path):
    with open(path) as f:
        return [int(line) for line in f]


def mean(xs):
    return sum(xs) // len(xs)


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def main(path):
    xs = read_numbers(path)
    print(f"count={len(xs)} mean={mean(xs):.2f} median={median(xs):.2f}")


if __name__ == "__main__":
    main(sys.argv[1])
'''
files = {"stats.py": broken, "numbers.txt": "4\n8\n\n15\n16\n23\n42\n"}
tb1("fix-python-stats", """
/app/stats.py should print `count=<n> mean=<mean> median=<median>` (two decimals each) for the numbers in the
file given as its argument: one number per line, integers or decimals, blank lines ignored. It has bugs: it
crashes on blank lines and decimals, the mean is rounded down, and the median is wrong for an even count
(it must be the average of the two middle values). Fix /app/stats.py, keeping its functions read_numbers,
mean and median, and then write its output for /app/numbers.txt to /app/numbers.out.
""", files, r"""
import importlib.util
import subprocess
import sys


def mod():
    spec = importlib.util.spec_from_file_location("stats", "/app/stats.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def test_mean_not_floored():
    assert mod().mean([1, 2]) == 1.5


def test_median_even_and_odd():
    m = mod()
    assert m.median([4, 1, 3, 2]) == 2.5 and m.median([5, 1, 3]) == 3


def test_reads_blank_lines_and_decimals(tmp_path):
    p = tmp_path / "n.txt"
    p.write_text("1.5\n\n2.5\n  \n3\n")
    assert mod().read_numbers(str(p)) == [1.5, 2.5, 3]


def test_cli_output(tmp_path):
    p = tmp_path / "n.txt"
    p.write_text("10\n\n20\n30\n40\n")
    r = subprocess.run([sys.executable, "/app/stats.py", str(p)], capture_output=True, text=True, timeout=10)
    assert r.stdout.strip() == "count=4 mean=25.00 median=25.00"


def test_numbers_out():
    assert open("/app/numbers.out").read().strip() == "count=6 mean=18.00 median=15.50"
""", r"""
python3 - <<'PY'
src = open("stats.py").read()
src = src.replace("return [int(line) for line in f]", "return [float(line) if '.' in line else int(line) for line in f if line.strip()]")
src = src.replace("return sum(xs) // len(xs)", "return sum(xs) / len(xs)")
src = src.replace("    return xs[len(xs) // 2]\n", "    n = len(xs)\n    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2\n")
open("stats.py", "w").write(src)
PY
python3 stats.py numbers.txt > numbers.out
""", tags=["python", "debugging"], category="debugging", difficulty="medium")

# 12 extract-emails ---------------------------------------------------------------------------
rng = random.Random(12)
people = ["alice", "bob.smith", "carol_w", "dave+news", "eve", "frank.o"]
domains = ["example.com", "mail.example.org", "corp.test"]
emails = set()
files = {}
for i in range(5):
    parts = []
    for _ in range(rng.randint(3, 7)):
        e = f"{rng.choice(people)}@{rng.choice(domains)}"
        emails.add(e.lower())
        form = rng.choice(["plain", "angle", "upper", "mailto"])
        if form == "angle":
            e2 = f"Name <{e}>"
        elif form == "upper":
            e2 = e.upper()
        elif form == "mailto":
            e2 = f"(mailto:{e})"
        else:
            e2 = e
        parts.append(f"Contact {e2}, about item {rng.randint(1, 99)}.")
    parts.append("Not an email: user@ or @host or a@b")
    files[f"contacts/batch{i}.txt"] = "\n".join(parts) + "\n"
exp = sorted(emails)
tb1("extract-emails", """
The text files in /app/contacts mention e-mail addresses in many forms (plain, inside <...>, after mailto:,
in upper case). Write every distinct address, lower-cased, one per line and sorted, to /app/emails.txt. An
address is `local@domain` where local may hold letters, digits, `.`, `_`, `+` and `-`, and the domain has at
least one dot. Also write the number of distinct addresses to /app/email_count.txt.
""", files, f"""
from pathlib import Path

EXPECTED = {exp!r}


def got():
    return Path("/app/emails.txt").read_text().split()


def test_all_found():
    assert set(EXPECTED) <= set(got())


def test_nothing_else():
    assert set(got()) <= set(EXPECTED)


def test_sorted_unique_lowercase():
    assert got() == EXPECTED


def test_count():
    assert Path("/app/email_count.txt").read_text().strip() == "{len(exp)}"
""", r"""
cat contacts/*.txt | grep -oiE '[a-z0-9._+-]+@[a-z0-9-]+(\.[a-z0-9-]+)+' | tr 'A-Z' 'a-z' | sort -u > emails.txt
wc -l < emails.txt | tr -d ' ' > email_count.txt
""", tags=["grep", "regex"], category="text-processing")

# 13 word-frequency ---------------------------------------------------------------------------
rng = random.Random(13)
vocab = ["river", "stone", "light", "garden", "shadow", "window", "harbor", "lantern", "the", "and", "of", "a",
         "to", "in", "silver", "morning", "quiet", "bridge", "orchard", "paper"]
stop = ["the", "and", "of", "a", "to", "in"]
wts = [rng.randint(1, 30) for _ in vocab]
text_lines = []
for i in range(80):
    words = rng.choices(vocab, wts, k=rng.randint(5, 12))
    words = [w.capitalize() if rng.random() < 0.2 else w for w in words]
    text_lines.append(" ".join(words) + rng.choice([".", ",", "!", "?", ";"]))
book = "\n".join(text_lines) + "\n"
c = Counter(w.lower() for w in re.findall(r"[A-Za-z]+", book) if w.lower() not in stop)
top = sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))[:10]
tb1("word-frequency", """
Find the ten most frequent words in /app/book.txt. A word is a run of ASCII letters, compared
case-insensitively; ignore the stop words listed in /app/stopwords.txt (one per line). Write /app/top_words.txt
with ten lines `<word> <count>` (word in lower case), most frequent first, ties broken alphabetically.
""", {"book.txt": book, "stopwords.txt": "\n".join(stop) + "\n"}, f"""
from pathlib import Path

TOP = {top!r}


def got():
    return [l.split() for l in Path("/app/top_words.txt").read_text().strip().splitlines()]


def test_ten_lines():
    assert len(got()) == 10


def test_no_stopwords():
    assert not {{w for w, _ in got()}} & set({sorted(stop)!r})


def test_most_frequent_word():
    assert got()[0] == [TOP[0][0], str(TOP[0][1])]


def test_full_ranking():
    assert got() == [[w, str(n)] for w, n in TOP]
""", r"""
grep -oE '[A-Za-z]+' book.txt | tr 'A-Z' 'a-z' | grep -vxF -f stopwords.txt | sort | uniq -c \
  | sort -k1,1nr -k2,2 | head -n10 | sed -E 's/^ *([0-9]+) (.*)$/\2 \1/' > top_words.txt
""", tags=["text", "sort", "uniq"], category="text-processing")

# 14 env-to-json ------------------------------------------------------------------------------
env = """# application settings
export APP_NAME="Demo App"
APP_PORT=8080

# database
DB_URL='postgres://user:pw@db:5432/app'
DB_POOL = 5
EMPTY_VALUE=
QUOTED_HASH="value # not a comment"
TRAILING=plain # comment here
"""
exp = {"APP_NAME": "Demo App", "APP_PORT": "8080", "DB_URL": "postgres://user:pw@db:5432/app", "DB_POOL": "5",
       "EMPTY_VALUE": "", "QUOTED_HASH": "value # not a comment", "TRAILING": "plain"}
tb1("env-to-json", """
Convert the dotenv file /app/app.env to a JSON object in /app/env.json (keys and values are strings). Rules:
ignore blank lines and lines starting with `#`; a leading `export ` is dropped; spaces around `=` are
ignored; a value in single or double quotes is taken literally without the quotes; in an unquoted value,
everything from ` #` on is a comment; an empty value is the empty string.
""", {"app.env": env}, f"""
import json

EXPECTED = {exp!r}


def got():
    with open("/app/env.json") as f:
        return json.load(f)


def test_valid_json_object():
    assert isinstance(got(), dict)


def test_keys():
    assert sorted(got()) == sorted(EXPECTED)


def test_quoted_values():
    g = got()
    assert g["APP_NAME"] == "Demo App" and g["DB_URL"] == EXPECTED["DB_URL"] and g["QUOTED_HASH"] == EXPECTED["QUOTED_HASH"]


def test_unquoted_values():
    g = got()
    assert (g["APP_PORT"], g["DB_POOL"], g["TRAILING"], g["EMPTY_VALUE"]) == ("8080", "5", "plain", "")
""", r"""
python3 - <<'PY'
import json
out = {}
for line in open("app.env"):
    line = line.strip()
    if not line or line.startswith("#"):
        continue
    if line.startswith("export "):
        line = line[len("export "):]
    key, _, val = line.partition("=")
    key, val = key.strip(), val.strip()
    if len(val) >= 2 and val[0] == val[-1] and val[0] in "'\"":
        val = val[1:-1]
    else:
        val = val.split(" #", 1)[0].strip()
    out[key] = val
json.dump(out, open("env.json", "w"), indent=2)
PY
""", tags=["json", "parsing"], category="data-processing", difficulty="medium")

# 15 large-files ------------------------------------------------------------------------------
rng = random.Random(15)
files = {}
sizes = {}
for p in ["storage/a/log1.txt", "storage/a/log2.txt", "storage/b/big.dat", "storage/b/c/huge.dat", "storage/small.txt",
          "storage/b/c/medium.txt", "storage/edge.txt", "storage/d/tiny.cfg"]:
    n = rng.choice([10, 200, 999, 1000, 1001, 1500, 4000, 8000]) if p != "storage/edge.txt" else 1000
    files[p] = "x" * (n - 1) + "\n"
    sizes[p.split("/", 1)[1]] = n
big = sorted(((s, p) for p, s in sizes.items() if s > 1000), key=lambda t: (-t[0], t[1]))
tb1("large-files", """
List the files under /app/storage that are larger than 1000 bytes. Write /app/large_files.txt with one line
per such file, `<size in bytes> <path relative to /app/storage>`, largest first (ties by path). Then move
those files into /app/archive, keeping their relative paths (for example /app/storage/x/y.dat goes to
/app/archive/x/y.dat).
""", files, f"""
from pathlib import Path

BIG = {big!r}
SIZES = {sizes!r}


def test_listing():
    assert Path("/app/large_files.txt").read_text().strip().splitlines() == [f"{{s}} {{p}}" for s, p in BIG]


def test_moved_to_archive():
    assert all((Path("/app/archive") / p).stat().st_size == s for s, p in BIG)


def test_removed_from_storage():
    assert not any((Path("/app/storage") / p).exists() for _, p in BIG)


def test_small_files_stay():
    small = [p for p, s in SIZES.items() if s <= 1000]
    assert all((Path("/app/storage") / p).is_file() for p in small)
""", r"""
cd storage
find . -type f -size +1000c -printf '%s %P\n' | sort -k1,1nr -k2,2 > ../large_files.txt
while read -r size path; do
  mkdir -p "../archive/$(dirname "$path")"
  mv -- "$path" "../archive/$path"
done < ../large_files.txt
""", tags=["find", "du"])

# 16 normalize-line-endings -------------------------------------------------------------------
files = {"docs/a.txt": "first line\r\nsecond line   \r\nthird\r\n", "docs/b.txt": "unix line\nno newline at end",
         "docs/c.txt": "mixed\r\nendings  \nhere\t\n", "docs/keep.md": "markdown\r\nstays\r\n"}
exp = {"docs/a.txt": "first line\nsecond line\nthird\n", "docs/b.txt": "unix line\nno newline at end\n",
       "docs/c.txt": "mixed\nendings\nhere\n"}
tb1("normalize-line-endings", """
Normalize every `.txt` file in /app/docs: convert Windows line endings (CRLF) to Unix (LF), remove trailing
spaces and tabs at the end of every line, and make sure the file ends with exactly one newline. Do not touch
files that are not `.txt`.
""", files, f"""
from pathlib import Path

EXPECTED = {exp!r}


def test_no_crlf():
    assert all(b"\\r" not in (Path("/app") / p).read_bytes() for p in EXPECTED)


def test_no_trailing_whitespace():
    for p in EXPECTED:
        assert all(l == l.rstrip() for l in (Path("/app") / p).read_text().split("\\n"))


def test_exact_contents():
    assert {{p: (Path("/app") / p).read_bytes().decode() for p in EXPECTED}} == EXPECTED


def test_markdown_untouched():
    assert Path("/app/docs/keep.md").read_bytes() == b"markdown\\r\\nstays\\r\\n"
""", r"""
for f in docs/*.txt; do
  sed -i -e 's/\r$//' -e 's/[ \t]*$//' "$f"
  [ -n "$(tail -c1 "$f")" ] && echo >> "$f"
done
true
""", tags=["sed", "text"], category="text-processing")

# 17 replace-in-tree --------------------------------------------------------------------------
files = {
    "deploy/app.conf": "upstream = https://old-api.example.com/v1\ntimeout = 5\n",
    "deploy/k8s/service.yaml": "url: old-api.example.com\nreplicas: 2\nbackup: old-api.example.com:8443\n",
    "deploy/k8s/ingress.yaml": "host: www.example.com\n",
    "deploy/README.md": "We moved off old-api.example.com in 2024.\n",
    "deploy/notes/old.conf": "# legacy\nold-api.example.com\n",
}
exp = {k: (v.replace("old-api.example.com", "api.example.com") if not k.endswith(".md") else v) for k, v in files.items()}
tb1("replace-in-tree", """
The service moved from `old-api.example.com` to `api.example.com`. Replace every occurrence of the old host
name with the new one in all `.conf` and `.yaml` files under /app/deploy (any depth). Leave `.md` files as
they are and do not leave backup copies (such as `*.bak` or `*~`) behind. Finally write the list of the files
you changed (paths relative to /app/deploy, sorted) to /app/changed.txt.
""", files, f"""
from pathlib import Path

EXPECTED = {exp!r}
ROOT = Path("/app")


def test_conf_and_yaml_updated():
    for p, text in EXPECTED.items():
        if not p.endswith(".md"):
            assert (ROOT / p).read_text() == text, p


def test_markdown_untouched():
    assert (ROOT / "deploy/README.md").read_text() == EXPECTED["deploy/README.md"]


def test_no_backups():
    names = [p.name for p in (ROOT / "deploy").rglob("*")]
    assert not [n for n in names if n.endswith((".bak", "~", ".orig"))]


def test_changed_list():
    assert (ROOT / "changed.txt").read_text().split() == ["app.conf", "k8s/service.yaml", "notes/old.conf"]
""", r"""
cd deploy
grep -rlF --include='*.conf' --include='*.yaml' 'old-api.example.com' . | sed 's#^\./##' | sort > ../changed.txt
while read -r f; do sed -i 's/old-api\.example\.com/api.example.com/g' "$f"; done < ../changed.txt
""", tags=["sed", "grep"], category="text-processing")

# 18 version-bump -----------------------------------------------------------------------------
files = {"VERSION": "1.4.9\n", "CHANGELOG.md": "# Changelog\n\n## 1.4.9\n- fix crash on empty input\n",
         "setup.cfg": "[metadata]\nname = demo\nversion = 1.4.9\n", "pending.txt": "add --json flag\nfaster startup\n"}
tb1("version-bump", """
Release a new minor version of the project in /app. The current version is in /app/VERSION (MAJOR.MINOR.PATCH).
Bump the minor number and reset the patch to 0, and write the new version to /app/VERSION and to the
`version = ` line of /app/setup.cfg. In /app/CHANGELOG.md insert, right after the `# Changelog` title and its
blank line, a section `## <new version>` with one `- <entry>` line per line of /app/pending.txt (same order)
followed by a blank line, then empty /app/pending.txt.
""", files, """
from pathlib import Path


def test_version_file():
    assert Path("/app/VERSION").read_text().strip() == "1.5.0"


def test_setup_cfg():
    assert "version = 1.5.0" in Path("/app/setup.cfg").read_text().splitlines()


def test_changelog():
    assert Path("/app/CHANGELOG.md").read_text() == (
        "# Changelog\\n\\n## 1.5.0\\n- add --json flag\\n- faster startup\\n\\n## 1.4.9\\n- fix crash on empty input\\n")


def test_pending_emptied():
    assert Path("/app/pending.txt").read_text().strip() == ""
""", r"""
old=$(cat VERSION)
IFS=. read -r major minor patch <<< "$old"
new="$major.$((minor + 1)).0"
echo "$new" > VERSION
sed -i "s/^version = .*/version = $new/" setup.cfg
{ echo "# Changelog"; echo; echo "## $new"; sed 's/^/- /' pending.txt; echo; tail -n +3 CHANGELOG.md; } > CHANGELOG.new
mv CHANGELOG.new CHANGELOG.md
: > pending.txt
""", tags=["release", "sed"], category="software-engineering")

# ===== TB2 / Harbor layout ====================================================================
# 19 users-json-transform
rng = random.Random(19)
users = []
for i in range(1, 16):
    users.append({"id": i, "name": f"User {i}", "email": f"user{i}@example.com", "active": rng.random() < 0.6,
                  "roles": sorted(rng.sample(["admin", "dev", "ops", "viewer"], rng.randint(1, 3)))})
active = {u["email"]: u["name"] for u in users if u["active"]}
roles = Counter(r for u in users for r in u["roles"])
tb2("users-json-transform", """
/app/users.json holds a list of user records (id, name, email, active, roles). Produce two files:

1. /app/active_users.json: a JSON object mapping the e-mail of every active user to their name.
2. /app/role_counts.json: a JSON object mapping every role to the number of users (active or not) that have it.
""", {"users.json": json.dumps(users, indent=2) + "\n"}, f"""
import json

ACTIVE = {active!r}
ROLES = {dict(roles)!r}


def load(p):
    with open(p) as f:
        return json.load(f)


def test_active_users_is_object():
    assert isinstance(load("/app/active_users.json"), dict)


def test_active_users():
    assert load("/app/active_users.json") == ACTIVE


def test_role_counts():
    assert load("/app/role_counts.json") == ROLES
""", r"""
python3 - <<'PY'
import json
from collections import Counter
users = json.load(open("users.json"))
json.dump({u["email"]: u["name"] for u in users if u["active"]}, open("active_users.json", "w"), indent=2)
json.dump(dict(Counter(r for u in users for r in u["roles"])), open("role_counts.json", "w"), indent=2)
PY
""", tags=["json"])

# 20 join-csv
rng = random.Random(20)
depts = [(1, "Engineering"), (2, "Sales"), (3, "Support"), (4, "Finance")]
emps = []
names = ["Zoe", "Adam", "Mia", "Liam", "Olivia", "Noah", "Emma", "Ava", "Lucas", "Ivy", "Ethan", "Nora"]
for i, n in enumerate(names, 1):
    emps.append((i, n, rng.choice([1, 2, 3, 4, 9])))
dname = dict(depts)
joined = sorted((n, dname.get(d, "UNKNOWN")) for _, n, d in emps)
per = Counter(dname.get(d, "UNKNOWN") for _, _, d in emps)
tb2("join-csv", """
Join /app/employees.csv (columns id, name, dept_id) with /app/departments.csv (columns dept_id, dept_name).
Write /app/joined.csv with the header `name,dept_name` and one row per employee, sorted by name; an employee
whose dept_id is not in departments.csv gets the department `UNKNOWN`. Also write /app/dept_sizes.csv with the
header `dept_name,employees` and one row per department that has employees (including UNKNOWN), sorted by
dept_name.
""", {"employees.csv": "id,name,dept_id\n" + "".join(f"{i},{n},{d}\n" for i, n, d in emps),
      "departments.csv": "dept_id,dept_name\n" + "".join(f"{i},{n}\n" for i, n in depts)}, f"""
import csv

JOINED = {joined!r}
SIZES = {sorted(per.items())!r}


def rows(p):
    with open(p, newline="") as f:
        return list(csv.reader(f))


def test_joined_header():
    assert rows("/app/joined.csv")[0] == ["name", "dept_name"]


def test_joined_rows():
    assert [tuple(r) for r in rows("/app/joined.csv")[1:]] == JOINED


def test_unknown_department():
    assert any(r[1] == "UNKNOWN" for r in rows("/app/joined.csv")[1:])


def test_dept_sizes():
    r = rows("/app/dept_sizes.csv")
    assert r[0] == ["dept_name", "employees"] and [(a, int(b)) for a, b in r[1:]] == SIZES
""", r"""
python3 - <<'PY'
import csv
from collections import Counter
depts = {r["dept_id"]: r["dept_name"] for r in csv.DictReader(open("departments.csv", newline=""))}
rows = sorted((r["name"], depts.get(r["dept_id"], "UNKNOWN")) for r in csv.DictReader(open("employees.csv", newline="")))
with open("joined.csv", "w", newline="") as f:
    w = csv.writer(f, lineterminator="\n")
    w.writerow(["name", "dept_name"])
    w.writerows(rows)
with open("dept_sizes.csv", "w", newline="") as f:
    w = csv.writer(f, lineterminator="\n")
    w.writerow(["dept_name", "employees"])
    w.writerows(sorted(Counter(d for _, d in rows).items()))
PY
""", tags=["csv", "join"])

# 21 split-log-by-date
rng = random.Random(21)
lines = []
for i in range(60):
    d = rng.choice(["2024-05-01", "2024-05-02", "2024-05-03", "2024-04-30"])
    lines.append(f"{d} {i % 24:02d}:{i % 60:02d}:00 event={i} user={rng.choice(['ann', 'ben', 'cid'])}")
by = {}
for l in lines:
    by.setdefault(l[:10], []).append(l)
tb2("split-log-by-date", """
Split /app/events.log into one file per day: every line starts with its date (YYYY-MM-DD); write the lines of
each date, in their original order, to /app/by_date/<date>.log. Then write /app/by_date/index.txt listing
`<date> <line count>` for each date, sorted by date.
""", {"events.log": "\n".join(lines) + "\n"}, f"""
from pathlib import Path

BY = {by!r}
D = Path("/app/by_date")


def test_one_file_per_date():
    assert sorted(p.name for p in D.glob("*.log")) == sorted(f"{{d}}.log" for d in BY)


def test_lines_in_order():
    for d, ls in BY.items():
        assert (D / f"{{d}}.log").read_text().splitlines() == ls


def test_index():
    assert (D / "index.txt").read_text().splitlines() == [f"{{d}} {{len(BY[d])}}" for d in sorted(BY)]
""", r"""
mkdir -p by_date
while IFS= read -r line; do
  printf '%s\n' "$line" >> "by_date/${line:0:10}.log"
done < events.log
for f in by_date/*.log; do
  printf '%s %s\n' "$(basename "$f" .log)" "$(wc -l < "$f" | tr -d ' ')"
done | sort > by_date/index.txt
""", tags=["bash", "logs"], category="log-analysis")

# 22 jsonl-errors
rng = random.Random(22)
recs = []
for i in range(40):
    recs.append({"ts": f"2024-06-01T12:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}Z", "method": rng.choice(["GET", "POST"]),
                 "path": rng.choice(["/a", "/b", "/c/d"]), "status": rng.choice([200, 201, 404, 500, 502, 503]),
                 "ms": rng.randint(1, 900)})
errs = sorted(({"ts": r["ts"], "path": r["path"], "status": r["status"]} for r in recs if r["status"] >= 500),
              key=lambda r: (r["ts"], r["path"], r["status"]))
slow = sorted({r["path"] for r in recs if r["ms"] > 500})
jl = "\n".join(json.dumps(r) for r in recs) + "\n"
jl = jl.replace("\n", "\n\n", 1)
tb2("jsonl-errors", """
/app/requests.jsonl has one JSON object per line (blank lines may occur) with the fields ts, method, path,
status and ms. Write /app/errors.jsonl with one JSON object per line for every request with status 500 or
above, keeping only the fields ts, path and status, sorted by ts (then path, then status). Also write
/app/slow_paths.txt listing, sorted and without repeats, the paths of the requests that took more than 500 ms.
""", {"requests.jsonl": jl}, f"""
import json
from pathlib import Path

ERRORS = {errs!r}
SLOW = {slow!r}


def errors():
    return [json.loads(l) for l in Path("/app/errors.jsonl").read_text().splitlines() if l.strip()]


def test_only_server_errors():
    assert errors() and all(e["status"] >= 500 for e in errors())


def test_fields():
    assert all(set(e) == {{"ts", "path", "status"}} for e in errors())


def test_exact_records_in_order():
    assert errors() == ERRORS


def test_slow_paths():
    assert Path("/app/slow_paths.txt").read_text().split() == SLOW
""", r"""
python3 - <<'PY'
import json
recs = [json.loads(l) for l in open("requests.jsonl") if l.strip()]
errs = sorted(({"ts": r["ts"], "path": r["path"], "status": r["status"]} for r in recs if r["status"] >= 500),
              key=lambda r: (r["ts"], r["path"], r["status"]))
with open("errors.jsonl", "w") as f:
    f.writelines(json.dumps(e) + "\n" for e in errs)
with open("slow_paths.txt", "w") as f:
    f.writelines(p + "\n" for p in sorted({r["path"] for r in recs if r["ms"] > 500}))
PY
""", tags=["json", "jsonl"])

# 23 checksum-manifest
rng = random.Random(23)
files = {f"release/{n}": f"{n} build {rng.randint(0, 10**9)}\n" * rng.randint(1, 4)
         for n in ["app-linux.tar", "app-mac.tar", "app-win.zip", "README.txt", "notes/CHANGES.txt"]}
sums = sorted((hashlib.sha256(v.encode()).hexdigest(), k.split("/", 1)[1]) for k, v in files.items())
sums = sorted(sums, key=lambda t: t[1])
tb2("checksum-manifest", """
Create /app/release/SHA256SUMS in the format that `sha256sum -c` reads (`<hex digest>  <path>`), with one line
for every file under /app/release (any depth, paths relative to /app/release, sorted by path, the SHA256SUMS
file itself excluded). It must verify: `cd /app/release && sha256sum -c SHA256SUMS` succeeds. Then write the
total size in bytes of those files to /app/release_size.txt.
""", files, f"""
import subprocess
from pathlib import Path

SUMS = {sums!r}
SIZE = {sum(len(v.encode()) for v in files.values())}


def lines():
    return Path("/app/release/SHA256SUMS").read_text().splitlines()


def test_manifest_lines():
    assert lines() == [f"{{h}}  {{p}}" for h, p in SUMS]


def test_does_not_list_itself():
    assert not any(l.endswith("SHA256SUMS") for l in lines())


def test_verifies():
    r = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd="/app/release", capture_output=True, timeout=10)
    assert r.returncode == 0


def test_total_size():
    assert Path("/app/release_size.txt").read_text().strip() == str(SIZE)
""", r"""
cd release
find . -type f ! -name SHA256SUMS -printf '%P\n' | LC_ALL=C sort | while IFS= read -r f; do sha256sum -- "$f"; done > /tmp/SHA256SUMS.tmp
mv /tmp/SHA256SUMS.tmp SHA256SUMS
echo $(( $(find . -type f ! -name SHA256SUMS -printf '%s+')0 )) > ../release_size.txt
""", tags=["checksum", "sha256sum"], category="file-operations")

# fail-to-pass / pass-to-pass lists (reward rule p6) -------------------------------------------
# Each task's hidden tests run in fresh bwrap sandboxes on the untouched workspace and after the
# oracle (terminal_bench.compute_test_lists); the lists go to harnessrl-tests.json in the task
# folder, keyed by a hash of the tests, oracle and workspace, which the loader checks. Computed
# here once rather than at every freeze or grading: the builtin tasks are fixed, and the lists are
# then reviewed in git like the tests themselves.
if "--no-lists" not in sys.argv[1:]:
    sys.path.insert(0, str(HERE.parents[3]))
    from tasks.records.suites import terminal_bench as _tb  # noqa: E402
    for _d in sorted(p for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")):
        _t = _tb.task_from_folder(_d, _tb.BUILTIN)
        _files = _t.workspace["files"]
        _tb.write_lists_file(_d, _tb.compute_test_lists(_t.verifier_spec, _files),
                             _tb.lists_key(_t.verifier_spec, _files))
