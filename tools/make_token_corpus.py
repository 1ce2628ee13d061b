#!/usr/bin/python3
"""Writes a byte-level token corpus for `--data tokens:path=FILE`.

Every regular file under the source folder (default /usr/share/common-licenses,
which every Debian machine has), in sorted name order, symlinks skipped (they
repeat a file), byte-level tokenised (vocab 256: token = byte), as one flat file
of little-endian uint16 ids. The same folder gives the same bytes.

usage: make_token_corpus.py OUT [SOURCE_DIR]
"""
import os
import struct
import sys


def main(argv):
    if len(argv) in (2, 3) and argv[1] in ("-h", "--help"):
        sys.stdout.write(__doc__)
        return 0
    if len(argv) not in (2, 3) or argv[1].startswith("-"):
        sys.stderr.write(__doc__)
        return 2
    out = argv[1]
    source = argv[2] if len(argv) == 3 else "/usr/share/common-licenses"
    names = sorted(n for n in os.listdir(source)
                   if not os.path.islink(os.path.join(source, n)) and os.path.isfile(os.path.join(source, n)))
    if not names:
        sys.stderr.write("error: %s: no files to tokenise\n" % source)
        return 1
    text = b"".join(open(os.path.join(source, n), "rb").read() for n in names)
    with open(out, "wb") as f:
        f.write(struct.pack("<%dH" % len(text), *text))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
