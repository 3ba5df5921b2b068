#!/usr/bin/env python3
"""Checks that the repository's prose names only things that exist.

Usage: check_paths.py REPO_ROOT

Scans every *.md file, and every comment line of the code under src/, reference/, gpu/, tests/
and python/ (.cpp .hpp .cu .cuh .py .sh .cmake, CMakeLists.txt), for:

  path      a repository-relative path (src/..., reference/..., gpu/..., proofs/..., tests/...,
            reports/..., docs/..., python/..., .ci/...) that does not exist; a glob pattern
            (src/*.cpp, reports/audit-suite-*.md) must match something; a path without an
            extension may name a source unit (reference/certify: reference/certify.*) or a
            target its folder's CMakeLists.txt builds (src/qkmla); a --plot prefix
            (reports/x.svg) is fine where reports/x-*.svg exist;
  file      a bare file name with a source extension (paging.hpp) that no file in the
            repository has;
  dir       a folder named as a location ("in cmake/") that no folder in the repository has;
  shared    a reference to ../shared (outside the repository);
  spec      a citation of "conventions §N" or of docs/conventions.md (the conventions are docs/conventions.md).

shared and spec are looked for on every line of a scanned file (comments, messages, docstrings);
path, file and dir in Markdown and in code comments (Python: also docstrings). This script does
not check itself.

Paths under build*/ (build outputs) and URLs are not checked. Prints file:line: kind: text for
each finding and a count by kind, Markdown and code apart; exits 1 if anything was found, 0
otherwise, 2 on bad usage. Python standard library only.
"""
import fnmatch
import os
import re
import sys
from collections import Counter

TOP = ["src", "reference", "gpu", "proofs", "tests", "reports", "docs", "python", ".ci"]
CODE_DIRS = ["src", "reference", "gpu", "tests", "python"]
CODE_EXT = (".cpp", ".hpp", ".cu", ".cuh", ".py", ".sh", ".cmake")
BARE_EXT = ("cpp", "hpp", "cu", "cuh", "py", "sh", "cmake")
SKIP_DIRS = {".git", "__pycache__", "node_modules"}

# A token starts where no path character precedes it (so lib/cmake/qkmla, ${DIR}/src/x and URLs
# are not read as repository paths).
PRE = r"(?<![\w./$}{~@:-])"
PATH_RE = re.compile(PRE + r"((?:" + "|".join(re.escape(t) for t in TOP) + r")/[\w.*?\[\]/+-]*)")
BARE_RE = re.compile(PRE + r"([A-Za-z_][\w+-]*(?:\.[\w-]+)*\.(?:" + "|".join(BARE_EXT) +
                     r"))(?![\w/])")
# A folder named as a location: "in cmake/", "under lib/", "see tools/".
DIR_RE = re.compile(r"\b(?:in|under|see|into|from) `?([A-Za-z_][\w.-]*)/(?=[\s`'\",;:)]|$)")
URL_RE = re.compile(r"[a-z][a-z0-9+.-]*://\S+")
SPEC_RE = re.compile(r"SPEC(?:'s)? ?§ ?[0-9]+(?:\.[0-9]+)?|SPEC(?:'s)? ?§|SPEC\.md")
SHARED_RE = re.compile(r"\.\./shared")


def skipped_dir(name):
    return name in SKIP_DIRS or name.startswith("build") or name.endswith(".egg-info") or \
        "venv" in name


def walk(root):
    """Yields repository-relative paths of all files and folders (build outputs excluded)."""
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if not skipped_dir(x))
        rel = os.path.relpath(d, root)
        for x in dirs:
            yield os.path.normpath(os.path.join(rel, x)), True
        for x in sorted(files):
            yield os.path.normpath(os.path.join(rel, x)), False


def comment_lines(path, text):
    """(line number, comment text) of a code file's comments."""
    hash_style = path.endswith((".py", ".sh", ".cmake")) or os.path.basename(path) == \
        "CMakeLists.txt"
    in_block = False
    in_doc = False  # Python: inside a triple-quoted string
    for n, line in enumerate(text.split("\n"), 1):
        if path.endswith(".py") and (in_doc or '"""' in line):
            quotes = line.count('"""')
            if in_doc or quotes:
                yield n, line.replace('"""', " ")
                if quotes % 2 == 1:
                    in_doc = not in_doc
                continue
        if hash_style:
            s = line.lstrip()
            if s.startswith("#!"):
                continue
            if s.startswith("#"):
                yield n, s[1:]
            else:
                m = re.search(r"\s#\s", line)  # a trailing comment
                if m:
                    yield n, line[m.end():]
            continue
        if in_block:
            end = line.find("*/")
            yield n, line if end < 0 else line[:end]
            in_block = end < 0
            continue
        c = line.find("//")
        b = line.find("/*")
        if c >= 0 and (b < 0 or c < b):
            yield n, line[c + 2:]
        elif b >= 0:
            end = line.find("*/", b + 2)
            yield n, line[b + 2:] if end < 0 else line[b + 2:end]
            in_block = end < 0


def main(argv):
    if len(argv) != 2 or not os.path.isdir(argv[1]):
        print(__doc__.strip().split("\n")[2], file=sys.stderr)
        return 2
    root = os.path.abspath(argv[1])
    entries = list(walk(root))
    files = [p for p, is_dir in entries if not is_dir]
    existing = {p for p, _ in entries}
    basenames = {os.path.basename(p) for p in files}
    dirnames = {os.path.basename(p) for p, is_dir in entries if is_dir}

    def matches(pattern):
        return any(fnmatch.fnmatchcase(p, pattern) for p in existing)

    def built_target(token):  # src/qkmla: a target of src/CMakeLists.txt, found in build*/src/
        d, name = os.path.split(token)
        cml = os.path.join(root, d, "CMakeLists.txt")
        if not d or "." in name or not os.path.isfile(cml):
            return False
        with open(cml, encoding="utf-8", errors="replace") as f:
            return re.search(r"add_(?:executable|library)\(\s*" + re.escape(name) + r"[\s)]",
                             f.read()) is not None

    def exists(token):
        token = token.rstrip("/")
        if any(ch in token for ch in "*?["):
            return matches(token)
        if os.path.normpath(token) in existing:
            return True
        stem, ext = os.path.splitext(token)
        if not ext:
            return matches(token + ".*") or built_target(token)
        return ext == ".svg" and matches(stem + "-*" + ext)

    me = os.path.realpath(__file__)
    scanned = []  # (relative path, is markdown)
    for p in files:
        if os.path.realpath(os.path.join(root, p)) == me:
            continue
        if p.endswith(".md"):
            scanned.append((p, True))
        elif p.split(os.sep)[0] in CODE_DIRS and (p.endswith(CODE_EXT) or
                                                  os.path.basename(p) == "CMakeLists.txt"):
            scanned.append((p, False))

    findings = []  # (is markdown, file, line, kind, text)
    for p, is_md in scanned:
        with open(os.path.join(root, p), encoding="utf-8", errors="replace") as f:
            text = f.read()
        lines = text.split("\n")
        for n, line in enumerate(lines, 1):  # any line of a scanned file
            if SHARED_RE.search(line):
                findings.append((is_md, p, n, "shared", line.strip()))
            for m in SPEC_RE.finditer(line):
                findings.append((is_md, p, n, "spec", m.group(0)))
        chunks = enumerate(lines, 1) if is_md else comment_lines(p, text)
        for n, chunk in chunks:
            chunk = URL_RE.sub(" ", chunk)
            for m in PATH_RE.finditer(chunk):
                token = m.group(1).rstrip(".,:;)")
                if token.count("/") == 1 and token.endswith("/"):  # the folder itself
                    continue
                if not exists(token):
                    findings.append((is_md, p, n, "path", token))
            for m in BARE_RE.finditer(chunk):
                name = m.group(1)
                if name not in basenames and not exists(name):
                    findings.append((is_md, p, n, "file", name))
            for m in DIR_RE.finditer(chunk):
                name = m.group(1)
                if name in TOP or name.startswith("build") or "." in name:
                    continue
                if name not in dirnames:
                    findings.append((is_md, p, n, "dir", name + "/"))

    for is_md, p, n, kind, t in sorted(findings, key=lambda x: (not x[0], x[1], x[2])):
        print(f"{p}:{n}: {kind}: {t}")
    for is_md, label in ((True, "Markdown"), (False, "code (comments; spec and shared: any line)")):
        count = Counter(k for m, _, _, k, _ in findings if m == is_md)
        total = sum(count.values())
        detail = ", ".join(f"{k} {v}" for k, v in sorted(count.items())) or "nothing"
        print(f"{label}: {total} finding(s) ({detail})")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
