"""report.views: what a person sees. (1) The default table's first screen: the summary and one
conclusion per profile within the first 25 lines, none wider than 100 columns. (2) --format html:
one self-contained file that parses, holds the summary, the rows' tables and the two charts inline;
each chart renders to a PNG with rsvg-convert. (3) --worst-first: ratios descend within a profile.
usage: check_report_views.py QKMLA_BINARY WORK_DIR"""
import html.parser
import os
import re
import subprocess
import sys

qkmla, work = sys.argv[1], sys.argv[2]
os.makedirs(work, exist_ok=True)
case = ["--preset", "tiny", "--seqlen", "96", "--profiles", "fp32,bf16,fp8"]
fails = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        fails.append(what)


text = subprocess.run([qkmla, "report", *case], capture_output=True, text=True, check=True).stdout
screen = text.splitlines()[:25]
check(any(l.startswith("summary:") for l in screen), "the summary is on the first screen")
for p in ("fp32", "bf16", "fp8"):
    check(any(l.strip().startswith(p + ": ") and "pass" in l.lower() for l in screen),
          f"a conclusion line for {p} on the first screen")
summary = screen[:screen.index("") if "" in screen else 25]
check(all(len(l) <= 100 for l in summary), "summary lines are at most 100 columns "
      f"(widest {max(map(len, summary))})")

out = os.path.join(work, "report.html")
subprocess.run([qkmla, "report", *case, "--format", "html", "-o", out], check=True, capture_output=True)


class Parser(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.stack, self.svgs, self.tables, self.cells, self.pre = [], 0, 0, [], ""

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "link", "img") and any(k in ("src", "href") for k, _ in attrs):
            fails.append(f"external resource <{tag}>: not self-contained")
        self.svgs += tag == "svg"
        self.tables += tag == "table"
        self.stack.append(tag)

    def handle_endtag(self, tag):
        while self.stack and self.stack.pop() != tag:
            pass

    def handle_data(self, data):
        if self.stack and self.stack[-1] == "td":
            self.cells.append(data)
        if self.stack and self.stack[-1] == "pre":
            self.pre += data


doc = open(out, encoding="utf-8").read()
p = Parser()
p.feed(doc)
p.close()
check(doc.startswith("<!DOCTYPE html>") and doc.rstrip().endswith("</html>"), "a whole HTML document")
check("summary:" in p.pre and "fp8: " in p.pre, "the summary block is in the HTML")
check(p.tables >= 3, f"one table per profile ({p.tables})")
check(p.cells.count("PASS") >= 10, f"verdict cells ({p.cells.count('PASS')} PASS)")
svgs = re.findall(r"<svg.*?</svg>", doc, re.S)
check(p.svgs == 2 and len(svgs) == 2, f"two inline charts ({p.svgs})")
for i, svg in enumerate(svgs):
    f = os.path.join(work, f"chart{i}.svg")
    open(f, "w", encoding="utf-8").write('<?xml version="1.0" encoding="utf-8"?>\n' + svg)
    png = f[:-4] + ".png"
    r = subprocess.run(["rsvg-convert", f, "-o", png], capture_output=True, text=True)
    ok = r.returncode == 0 and open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n" and os.path.getsize(png) > 5000
    check(ok, f"chart {i} renders to a PNG ({os.path.getsize(png) if os.path.exists(png) else 0} bytes) {r.stderr.strip()}")
check("alpha_q_folded" in svgs[0] and "alpha<" not in svgs[0], "series names are literal (no subscripts)")

text = subprocess.run([qkmla, "report", *case, "--worst-first"], capture_output=True, text=True, check=True).stdout
ratios, section = {}, None
for line in text.splitlines():
    m = re.match(r"-- profile (\w+) --", line)
    if m:
        section = m.group(1)
        continue
    cols = line.split()
    if section and len(cols) >= 7 and cols[0].startswith(("cpu.", "gpu.", "ref.", "quant.")):
        if cols[4] != "-":
            ratios.setdefault(section, []).append(float(cols[4]))
check(all(r == sorted(r, reverse=True) and r for r in ratios.values()) and len(ratios) == 3,
      "--worst-first: ratios descend within each profile")
sys.exit(1 if fails else 0)
