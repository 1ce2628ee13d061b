#!/usr/bin/python3
"""Records what `strata` makes of a fixed corpus, and compares two recordings.

Usage (tools/plan_corpus.sh has the full story):
  plan_corpus.py record STRATA_BIN OUT_DIR [--jobs N]
  plan_corpus.py diff OLD_DIR NEW_DIR [--lines N] [--files N]

Only the standard library: it runs under Debian's /usr/bin/python3.
"""

import argparse
import concurrent.futures
import difflib
import fnmatch
import glob
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS_FOLDER = os.path.join(REPO, "tools", "plan_corpus")

# Programs made by `strata gen` (name, arguments), beside the committed ones.
# Together with examples/, tests/fuzz/ and tools/plan_corpus/ they cover every
# op family, every optimizer and 1 to 4 stages. An entry whose gen fails is
# recorded like any case and gives no program (mlp_s5_too_many: on purpose).
GENERATED = [
    ("mlp_s1_adam", ["mlp"]),
    ("mlp_s2_sgd_const", ["mlp", "--stages", "2", "--optimizer", "sgd", "--nocosine", "--lr", "0.1"]),
    ("mlp_s3_momentum_f64", ["mlp", "--stages", "3", "--optimizer", "momentum", "--dtype", "F64"]),
    ("mlp_s4_adamw", ["mlp", "--stages", "4", "--optimizer", "adamw", "--layers", "784,256,128,64,32,10"]),
    ("convnet_s1_sgd", ["convnet", "--optimizer", "sgd"]),
    ("convnet_s3_adamw", ["convnet", "--stages", "3", "--optimizer", "adamw"]),
    ("alexnet_s2_momentum", ["alexnet", "--stages", "2", "--optimizer", "momentum"]),
    ("resmlp_s2_dropout_adamw", ["resmlp", "--stages", "2", "--dropout", "0.1", "--optimizer", "adamw"]),
    ("resmlp_s4_f64_momentum",
     ["resmlp", "--stages", "4", "--blocks", "3", "--dtype", "F64", "--optimizer", "momentum", "--lr", "0.01"]),
    ("mlp_s5_too_many", ["mlp", "--stages", "5", "--layers", "784,64,10"]),
]

# Where committed programs and strategies come from: (name prefix, folder).
SOURCES = [("examples", "examples"), ("fuzz", "tests/fuzz"), ("plan_corpus", "tools/plan_corpus")]

# `device` variants run with these extra flags whether or not the tool takes
# them today (it then refuses, and the refusal is what gets recorded).
DEVICE_FLAGS = ["--device", "gpu"]

TIMEOUT_S = 120
WORK = b"<WORK>"
STRATA = b"<STRATA>"

# --- normalisation (diff) ------------------------------------------------------
#
# Fields an architecture refactor (issue 16) may add or reshape without
# changing what a plan means. They are removed, whole messages included, from
# every .pbtxt file of both recordings before comparing. Patterns are dotted
# field paths from the file's top message, matched with fnmatch.
STRIP_ALWAYS = [
    "topology.mesh",        # the device mesh: named axes and their sizes
    "topology.coordinate",  # this rank's coordinates on the mesh
    "topology.group",       # the communication groups this rank belongs to
]
# Fields named like a device (last path component) that only NEW has: removed
# from a NEW file wherever the OLD file has no field at that path. A device
# field both have (the ops' `device: "gpu:1"` placement) is compared as usual.
NEW_ONLY_NAMES = re.compile(r"^(device|devices|device_\w+|\w+_device)$")
# Values computed from the whole file (the plan's fingerprint hashes every
# field, the ones above included): removed from both sides only where the
# fields removed above differ between OLD and NEW, which explains them.
DERIVED = ["fingerprint"]
# Lines removed from the other files (run.txt: check's report, messages), as
# regular expressions; none yet. Example: r"^  mesh: " if check printed the mesh.
STRIP_LINES = []
# Files neither side's content is compared for: what binary made the recording.
IGNORED_FILES = ["recording.txt"]


def die(message, code=2):
    print("plan_corpus: " + message, file=sys.stderr)
    sys.exit(code)


# --- record --------------------------------------------------------------------


def committed_inputs():
    """(programs, strategies): lists of (name, path) from the source folders."""
    programs, strategies = [], []
    for prefix, folder in SOURCES:
        for path in sorted(glob.glob(os.path.join(REPO, folder, "*.pbtxt"))):
            base = os.path.basename(path)
            if base.endswith(".strategy.pbtxt"):
                strategies.append((prefix + "." + base[: -len(".strategy.pbtxt")], path))
            else:
                programs.append((prefix + "." + base[: -len(".pbtxt")], path))
    return programs, strategies


class Runner:
    def __init__(self, strata, work):
        self.strata = strata
        self.work = work
        self.env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "TZ": "UTC", "HOME": work}
        self.runs = 0
        self.lock = threading.Lock()

    def scrub(self, data):
        for path in sorted({self.work, os.path.realpath(self.work)}, key=len, reverse=True):
            data = data.replace(path.encode(), WORK)
        for path in sorted({self.strata, os.path.realpath(self.strata)}, key=len, reverse=True):
            data = data.replace(path.encode(), STRATA)
        return data

    def run(self, args):
        """Runs strata ARGS in the work folder: (stdout, stderr, status line)."""
        with self.lock:
            self.runs += 1
        try:
            p = subprocess.run([self.strata] + args, cwd=self.work, env=self.env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired as e:
            return e.stdout or b"", e.stderr or b"", "TIMED OUT after %d s" % TIMEOUT_S
        if p.returncode < 0:
            try:
                name = signal.Signals(-p.returncode).name
            except ValueError:
                name = str(-p.returncode)
            status = "KILLED by signal %s" % name
        else:
            status = "exit code %d" % p.returncode
        return p.stdout, p.stderr, status


def run_text(args, stdout, stderr, status, files_note=""):
    parts = [b"$ strata " + " ".join(args).encode() + b"\n", status.encode() + b"\n"]
    parts += [b"--- stdout\n", stdout, b"" if stdout.endswith(b"\n") or not stdout else b"\n[no newline at end]\n"]
    parts += [b"--- stderr\n", stderr, b"" if stderr.endswith(b"\n") or not stderr else b"\n[no newline at end]\n"]
    if files_note:
        parts += [b"--- files\n", files_note.encode()]
    return b"".join(parts)


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def list_files(root):
    found = []
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            found.append(os.path.relpath(os.path.join(folder, name), root))
    return found


def record(strata, out_dir, jobs):
    strata = os.path.abspath(strata)
    if not os.access(strata, os.X_OK):
        die("%s is not an executable" % strata)
    if os.path.exists(out_dir) and os.listdir(out_dir):
        die("%s exists and is not empty; record into a new folder" % out_dir)
    os.makedirs(out_dir, exist_ok=True)
    started = time.monotonic()
    work = tempfile.mkdtemp(prefix="plan_corpus.")
    try:
        runner = Runner(strata, work)
        record_into(runner, out_dir, jobs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("plan_corpus: %d strata runs recorded into %s in %.0f s" %
          (runner.runs, out_dir, time.monotonic() - started), file=sys.stderr)


def record_into(runner, out_dir, jobs):
    work = runner.work
    for sub in ("programs", "strategies", "out"):
        os.makedirs(os.path.join(work, sub))
    manifest = []

    # What the tool says about itself.
    meta = [("help", ["--help"])] + [(c + "_help", [c, "--help"]) for c in ("check", "compile", "gen", "run")]
    for name, args in meta:
        stdout, stderr, status = runner.run(args)
        write(os.path.join(out_dir, "meta", name + ".txt"), runner.scrub(run_text(args, stdout, stderr, status)))

    # Programs: committed ones, then generated ones.
    programs, strategy_files = committed_inputs()
    inputs = []
    for name, path in programs:
        shutil.copyfile(path, os.path.join(work, "programs", name + ".pbtxt"))
        inputs.append((name, "programs/" + name + ".pbtxt"))
        manifest.append("program %s  %s  sha256 %s" % (name, os.path.relpath(path, REPO), sha256(path)))
    for name, gen_args in GENERATED:
        args = ["gen"] + gen_args
        stdout, stderr, status = runner.run(args)
        write(os.path.join(out_dir, "gen", name + ".txt"), runner.scrub(run_text(args, stdout, stderr, status)))
        if status != "exit code 0":
            manifest.append("program gen.%s  not generated: strata %s: %s" % (name, " ".join(args), status))
            continue
        with open(os.path.join(work, "programs", "gen." + name + ".pbtxt"), "wb") as f:
            f.write(stdout)
        inputs.append(("gen." + name, "programs/gen." + name + ".pbtxt"))
        manifest.append("program gen.%s  strata %s" % (name, " ".join(args)))
    strategies = [("none", None)]
    manifest.append("strategy none  (no --strategy)")
    for name, path in strategy_files:
        shutil.copyfile(path, os.path.join(work, "strategies", name + ".strategy.pbtxt"))
        strategies.append((name, "strategies/" + name + ".strategy.pbtxt"))
        manifest.append("strategy %s  %s  sha256 %s" % (name, os.path.relpath(path, REPO), sha256(path)))

    # The passes, from the tool's own refusal of an unknown one (which it
    # gives only for a program that compiles: the first one that does).
    for _, program_path in inputs:
        args = ["compile", program_path, "--out", "out/passes", "--dump_after", "bogus"]
        stdout, stderr, status = runner.run(args)
        m = re.search(rb"\((?:this compile's )?passes: ([^)]*)\)", stderr)
        if m:
            break
    else:
        die("cannot read the pass list from `strata %s` (%s): %r" % (" ".join(args), status, stderr[:300]), 1)
    write(os.path.join(out_dir, "meta", "dump_after_bogus.txt"), runner.scrub(run_text(args, stdout, stderr, status)))
    passes = [p.strip() for p in m.group(1).decode().split(",") if p.strip()]
    manifest.append("passes " + ", ".join(passes))

    # Every program x strategy x variant.
    cases = []
    for program, program_path in inputs:
        for strategy, strategy_path in strategies:
            base = [program_path] + (["--strategy", strategy_path] if strategy_path else [])
            folder = "%s/%s" % (program, strategy)
            os.makedirs(os.path.join(work, "out", folder))  # compile makes --out, not its parents
            cases.append((folder + "/check", ["check"] + base, False))
            cases.append((folder + "/check_device_gpu", ["check"] + base + DEVICE_FLAGS, False))
            cases.append((folder + "/compile", ["compile"] + base + ["--out", "out/%s/compile" % folder], True))
            cases.append((folder + "/compile_device_gpu",
                          ["compile"] + base + DEVICE_FLAGS + ["--out", "out/%s/compile_device_gpu" % folder], True))
            for p in passes:
                cases.append((folder + "/dump_after_" + p,
                              ["compile"] + base + ["--out", "out/%s/dump_after_%s" % (folder, p), "--dump_after", p],
                              True))
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(lambda case: runner.run(case[1]), cases))

    # Write the results in a fixed order; a dump's plan files that equal the
    # plain compile's are named, not copied.
    for (case, args, writes), (stdout, stderr, status) in zip(cases, results):
        case_dir = os.path.join(out_dir, "cases", case)
        note = ""
        if writes:
            out = os.path.join(work, "out", case)
            plain = os.path.join(work, "out", os.path.dirname(case), "compile")
            lines = []
            for rel in list_files(out) if os.path.isdir(out) else []:
                with open(os.path.join(out, rel), "rb") as f:
                    data = runner.scrub(f.read())
                twin = os.path.join(plain, rel)
                if case.rsplit("/", 1)[1] != "compile" and os.path.isfile(twin):
                    with open(twin, "rb") as f:
                        if runner.scrub(f.read()) == data:
                            lines.append(rel + "  (identical to ../compile/files/%s)\n" % rel)
                            continue
                lines.append(rel + "\n")
                write(os.path.join(case_dir, "files", rel), data)
            note = "".join(lines) or "(none)\n"
        write(os.path.join(case_dir, "run.txt"), runner.scrub(run_text(args, stdout, stderr, status, note)))

    # Anything a run wrote outside its --out folder.
    stray = [f for f in list_files(work) if f.split(os.sep)[0] not in ("programs", "strategies", "out")]
    out_folders = {os.path.join("out", c[0]) for c in cases if c[2]} | {os.path.join("out", "passes")}
    for f in list_files(os.path.join(work, "out")):
        parents = [os.path.join("out", f)]
        while parents[-1] != "out":
            parents.append(os.path.dirname(parents[-1]))
        if not out_folders.intersection(parents):
            stray.append(os.path.join("out", f))
    manifest.append("files written outside --out: " + (", ".join(stray) if stray else "none"))
    write(os.path.join(out_dir, "corpus.txt"), ("\n".join(manifest) + "\n").encode())

    statuses = {}
    for status in (r[2] for r in results):
        statuses[status] = statuses.get(status, 0) + 1
    summary = ["strata sha256 %s" % sha256(runner.strata),
               "%d programs x %d strategies x %d variants = %d cases" %
               (len(inputs), len(strategies), len(cases) // max(1, len(inputs) * len(strategies)), len(cases))]
    summary += ["  %5d  %s" % (n, s) for s, n in sorted(statuses.items())]
    write(os.path.join(out_dir, "recording.txt"), ("\n".join(summary) + "\n").encode())
    print("\n".join(summary[1:]), file=sys.stderr)


# --- text-format protos --------------------------------------------------------

TOKEN = re.compile(r"""
    (?P<space>\s+) | (?P<comment>\#[^\n]*) |
    (?P<string>"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*') |
    (?P<word>[A-Za-z0-9_.+\-]+) | (?P<punct>[{}<>\[\]:,;/])
""", re.VERBOSE)


class ParseError(Exception):
    pass


def tokenize(text):
    tokens, pos = [], 0
    while pos < len(text):
        m = TOKEN.match(text, pos)
        if not m:
            raise ParseError("unexpected %r at offset %d" % (text[pos], pos))
        if m.lastgroup not in ("space", "comment"):
            tokens.append((m.group(), m.start(), m.end()))
        pos = m.end()
    return tokens


def parse_fields(text):
    """Every field of a text-format message: (dotted path, start, end) spans."""
    tokens = tokenize(text)
    fields = []
    i = 0

    def expect(tok):
        nonlocal i
        if i >= len(tokens) or tokens[i][0] != tok:
            raise ParseError("expected %r at token %d" % (tok, i))
        i += 1

    def value(path):
        # A message, a [list], or a scalar (adjacent strings concatenate).
        nonlocal i
        if i >= len(tokens):
            raise ParseError("value missing at the end")
        tok = tokens[i][0]
        if tok in ("{", "<"):
            i += 1
            body(path, "}" if tok == "{" else ">")
        elif tok == "[":
            i += 1
            while i < len(tokens) and tokens[i][0] != "]":
                value(path)
                if i < len(tokens) and tokens[i][0] == ",":
                    i += 1
            expect("]")
        elif tokens[i][0][0] in "\"'":
            while i < len(tokens) and tokens[i][0][0] in "\"'":
                i += 1
        elif re.match(r"[A-Za-z0-9_.+\-]", tok):
            i += 1
        else:
            raise ParseError("unexpected %r at offset %d" % (tok, tokens[i][1]))

    def body(prefix, close):
        nonlocal i
        while i < len(tokens) and tokens[i][0] != close:
            start = tokens[i][1]
            if tokens[i][0] == "[":  # an extension or Any: [type.googleapis.com/x.Y]
                j = i
                while j < len(tokens) and tokens[j][0] != "]":
                    j += 1
                name = "".join(t[0] for t in tokens[i:j + 1])
                i = j + 1
            elif re.match(r"[A-Za-z_]\w*$", tokens[i][0]):
                name = tokens[i][0]
                i += 1
            else:
                raise ParseError("expected a field name, got %r at offset %d" % (tokens[i][0], start))
            if i < len(tokens) and tokens[i][0] == ":":
                i += 1
            path = prefix + "." + name if prefix else name
            value(path)
            if i < len(tokens) and tokens[i][0] in (",", ";"):
                i += 1
            fields.append((path, start, tokens[i - 1][2]))
        if close:
            expect(close)

    body("", None)
    if i != len(tokens):
        raise ParseError("unbalanced %r at offset %d" % (tokens[i][0], tokens[i][1]))
    return fields


def strip_spans(text, spans):
    """Removes the spans (outermost first wins), whole lines where a span fills its lines."""
    keep, pos = [], 0
    for start, end in sorted(spans):
        if start < pos:
            continue  # inside a span already removed
        line_start = text.rfind("\n", 0, start) + 1
        line_end = text.find("\n", end)
        line_end = len(text) if line_end < 0 else line_end + 1
        if not text[line_start:start].strip() and not text[end:line_end].strip() and line_start >= pos:
            start, end = line_start, line_end
        keep.append(text[pos:start])
        pos = end
    keep.append(text[pos:])
    return "".join(keep)


def normalisable_spans(fields, old_paths=None):
    """(spans of the fields a refactor may add, spans of DERIVED fields); old_paths: OLD's, when these are NEW's."""
    spans, derived = [], []
    for path, start, end in fields:
        if any(fnmatch.fnmatchcase(path, p) for p in STRIP_ALWAYS):
            spans.append((start, end))
        elif old_paths is not None and NEW_ONLY_NAMES.match(path.rsplit(".", 1)[-1]) and path not in old_paths:
            spans.append((start, end))
        elif path in DERIVED:
            derived.append((start, end))
    return spans, derived


def normalise_pair(old, new):
    """OLD's and NEW's text of one .pbtxt file, normalised (raises ParseError)."""
    old_fields = parse_fields(old)
    old_spans, old_derived = normalisable_spans(old_fields)
    new_spans, new_derived = normalisable_spans(parse_fields(new), {p for p, _, _ in old_fields})
    removed = lambda text, spans: [" ".join(text[a:b].split()) for a, b in sorted(spans)]
    if removed(old, old_spans) != removed(new, new_spans):
        old_spans += old_derived
        new_spans += new_derived
    return strip_spans(old, old_spans), strip_spans(new, new_spans)


def normalise_lines(text):
    if not STRIP_LINES:
        return text
    return "".join(l for l in text.splitlines(True) if not any(re.search(p, l) for p in STRIP_LINES))


# --- diff ----------------------------------------------------------------------


def read_text(path):
    with open(path, "rb") as f:
        return f.read().decode("utf-8", errors="replace")


def compare(old_dir, new_dir, lines_per_file, max_files):
    for d in (old_dir, new_dir):
        if not os.path.isfile(os.path.join(d, "recording.txt")):
            die("%s is not a plan_corpus recording (no recording.txt)" % d)
    old_files, new_files = set(list_files(old_dir)), set(list_files(new_dir))
    ignored = set(IGNORED_FILES)
    report, changed, only_old, only_new, notes = [], [], [], [], []
    first = lambda rel: (rel != "corpus.txt", rel)  # a different corpus explains the rest
    for rel in sorted((old_files | new_files) - ignored, key=first):
        if rel not in new_files:
            only_old.append(rel)
            continue
        if rel not in old_files:
            only_new.append(rel)
            continue
        old, new = read_text(os.path.join(old_dir, rel)), read_text(os.path.join(new_dir, rel))
        if old == new:
            continue
        if rel.endswith(".pbtxt"):
            try:
                old, new = normalise_pair(old, new)
            except ParseError as e:
                notes.append("%s: not normalised (%s)" % (rel, e))
        else:
            old, new = normalise_lines(old), normalise_lines(new)
        if old == new:
            continue
        changed.append(rel)
        if len(changed) <= max_files:
            diff = list(difflib.unified_diff(old.splitlines(), new.splitlines(), "OLD/" + rel, "NEW/" + rel,
                                             n=1, lineterm=""))
            shown = diff if lines_per_file <= 0 else diff[:lines_per_file]
            report += shown
            if len(shown) < len(diff):
                report.append("  ... %d more diff lines" % (len(diff) - len(shown)))

    if read_text(os.path.join(old_dir, "recording.txt")).splitlines()[0] == \
            read_text(os.path.join(new_dir, "recording.txt")).splitlines()[0]:
        notes.append("both recordings come from the same strata binary")
    if "corpus.txt" in changed:
        notes.insert(0, "corpus.txt differs: the recordings did not use the same corpus (compare like with like)")

    cases = lambda files: {f.split("/files/")[0].rsplit("/run.txt", 1)[0] for f in files if f.startswith("cases/")}
    differing = len(changed) + len(only_old) + len(only_new)
    for line in report:
        print(line)
    if len(changed) > max_files:
        print("... and %d more changed files (raise --files to see them)" % (len(changed) - max_files))
    for label, files in (("only in OLD", only_old), ("only in NEW", only_new)):
        for f in files[:max_files]:
            print("%s: %s" % (label, f))
        if len(files) > max_files:
            print("%s: ... and %d more" % (label, len(files) - max_files))
    for note in notes:
        print("note: " + note)
    total = len((old_files | new_files) - ignored)
    if differing == 0:
        print("identical: %d files, after normalising %s and new device fields" %
              (total, ", ".join(STRIP_ALWAYS)))
        return 0
    print("DIFFERENT: %d of %d files (%d changed, %d only in OLD, %d only in NEW), in %d case(s)" %
          (differing, total, len(changed), len(only_old), len(only_new), len(cases(changed + only_old + only_new))))
    return 1


def main():
    parser = argparse.ArgumentParser(prog="plan_corpus", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="run the corpus through STRATA_BIN into OUT_DIR")
    rec.add_argument("strata")
    rec.add_argument("out_dir")
    rec.add_argument("--jobs", type=int, default=2, help="strata runs at once (default 2)")
    dif = sub.add_parser("diff", help="compare two recordings; exit 0 when identical, 1 when not")
    dif.add_argument("old_dir")
    dif.add_argument("new_dir")
    dif.add_argument("--lines", type=int, default=12, help="diff lines shown per file (0: all)")
    dif.add_argument("--files", type=int, default=40, help="changed files shown")
    args = parser.parse_args()
    if args.command == "record":
        record(args.strata, args.out_dir, max(1, args.jobs))
        return 0
    return compare(args.old_dir, args.new_dir, args.lines, args.files)


if __name__ == "__main__":
    sys.exit(main())
