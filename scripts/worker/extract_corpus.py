#!/usr/bin/env python3
"""Extracts Jane Austen's novels (Debian r-cran-janeaustenr) and the World English Bible
(Debian sword-text-web) into .cache/corpus/ as plain UTF-8 text.

Stdlib only; no R. The package is fetched with `apt-get download` and unpacked with `dpkg -x`
(installing it would pull in R). Its data is an R lazy-load database: Rdata.rdx (zlib-compressed
R serialization of name -> (offset, length)) and Rdata.rdb (at each offset: 4-byte big-endian
length, then a zlib stream of one R-serialized object, XDR format); the .rdx itself is in
fact a gzip file (saveRDS), not the 4-byte-length + zlib form. Each novel is a character
vector of lines; we write one UTF-8 text file per novel (e.g. .cache/corpus/persuasion.txt).

The Bible is a SWORD zText module: .bzs holds 12-byte records (offset, compressed size, size)
of zlib blocks in .bzz; .bzv holds 10-byte records (block, offset, size) per verse; verse text
is OSIS XML, from which we drop <note> elements and all tags (-> web_bible.txt, a haystack).

Usage: python3 scripts/worker/extract_corpus.py [--out DIR] [--deb FILE] [--no-bible]
"""
import argparse
import glob
import gzip
import html
import re
import os
import struct
import subprocess
import sys
import tempfile
import zlib

NOVELS = ["persuasion", "sensesensibility", "prideprejudice", "mansfieldpark", "emma",
          "northangerabbey"]


class RReader:
    """Just enough of R's XDR serialization (format 2/3) for lists of vectors."""

    def __init__(self, data):
        self.d = data
        self.p = 0
        self.refs = []

    def int(self):
        v = struct.unpack_from(">i", self.d, self.p)[0]
        self.p += 4
        return v

    def header(self):
        if self.d[:2] != b"X\n":
            raise ValueError("not an XDR R serialization")
        self.p = 2
        version = self.int()
        self.int()  # writer R version
        self.int()  # minimal reader version
        if version == 3:
            n = self.int()
            self.p += n  # native encoding name

    def item(self):
        flags = self.int()
        t = flags & 0xFF
        has_attr = bool(flags & (1 << 9))
        has_tag = bool(flags & (1 << 10))
        if t == 254:  # NILVALUE_SXP
            return None
        if t in (242, 241, 247, 251, 252, 253):  # special environments / markers
            return None
        if t == 255:  # REFSXP
            idx = flags >> 8
            if idx == 0:
                idx = self.int()
            return self.refs[idx - 1]
        if t == 1:  # SYMSXP
            name = self.item()
            self.refs.append(name)
            return name
        if t == 9:  # CHARSXP
            n = self.int()
            if n == -1:
                return None
            raw = self.d[self.p:self.p + n]
            self.p += n
            levels = flags >> 12
            return raw.decode("latin-1" if levels & 4 else "utf-8", errors="replace")
        if t in (2, 6, 239, 240):  # pairlists: attributes, tag, car, cdr
            attr = self.item() if has_attr else None
            tag = self.item() if has_tag else None
            car = self.item()
            cdr = self.item()
            out = [(tag, car)]
            if isinstance(cdr, list) and cdr and isinstance(cdr[0], tuple):
                out += cdr
            return out
        if t in (10, 13):  # logical, integer
            n = self.int()
            v = list(struct.unpack_from(">%di" % n, self.d, self.p))
            self.p += 4 * n
        elif t == 14:  # double
            n = self.int()
            v = list(struct.unpack_from(">%dd" % n, self.d, self.p))
            self.p += 8 * n
        elif t in (16, 19, 20):  # character vector, list, expression
            n = self.int()
            v = [self.item() for _ in range(n)]
        elif t == 24:  # raw
            n = self.int()
            v = self.d[self.p:self.p + n]
            self.p += n
        else:
            raise ValueError("unsupported R type %d at byte %d" % (t, self.p))
        attrs = self.item() if has_attr else None
        return RVector(v, attrs)


class RVector(list):
    def __init__(self, values, attrs):
        super().__init__(values)
        self.attrs = dict(attrs) if attrs else {}


def unserialize(blob):
    r = RReader(blob)
    r.header()
    return r.item()


def read_compressed(buf, offset=0):
    if buf[offset:offset + 2] == b"\x1f\x8b":  # the .rdx index is a gzip file (saveRDS)
        return gzip.decompress(buf[offset:])
    n = struct.unpack_from(">I", buf, offset)[0]
    out = zlib.decompress(buf[offset + 4:])
    if len(out) != n:
        raise ValueError("length mismatch in compressed R object")
    return out


def fetch_deb(workdir, package):
    subprocess.run(["apt-get", "download", package], cwd=workdir, check=True,
                   stdout=subprocess.DEVNULL)
    debs = glob.glob(os.path.join(workdir, package + "_*.deb"))
    if not debs:
        raise SystemExit("apt-get download %s produced no .deb" % package)
    return debs[0]


NOTE = re.compile(r"<note\b.*?</note>", re.S)
PARAGRAPH = re.compile(r'<div\b[^>]*type="x-p"[^>]*/>')
TAG = re.compile(r"<[^>]+>")


def osis_to_text(xml):
    # Footnotes often abut the next word ("God<note>..</note><w>created"): replace them with a
    # space, then drop the spaces this leaves before closing punctuation.
    xml = PARAGRAPH.sub("\n", NOTE.sub(" ", xml))
    text = re.sub(r"[ \t]+", " ", html.unescape(TAG.sub("", xml)))
    return re.sub(r" ([,.;:!?\u2019\u201d)])", r"\1", text)


def extract_bible(out_path, deb=None):
    with tempfile.TemporaryDirectory() as tmp:
        deb = deb or fetch_deb(tmp, "sword-text-web")
        subprocess.run(["dpkg", "-x", deb, os.path.join(tmp, "x")], check=True)
        mod = glob.glob(os.path.join(tmp, "x", "usr", "share", "sword", "modules", "texts",
                                     "ztext", "*"))[0]
        verses = []
        for testament in ("ot", "nt"):
            bzs = open(os.path.join(mod, testament + ".bzs"), "rb").read()
            bzz = open(os.path.join(mod, testament + ".bzz"), "rb").read()
            bzv = open(os.path.join(mod, testament + ".bzv"), "rb").read()
            blocks = {}
            for i in range(0, len(bzv), 10):
                block, offset, size = struct.unpack_from("<IIH", bzv, i)
                if size == 0:
                    continue
                if block not in blocks:
                    start, csize, _ = struct.unpack_from("<III", bzs, 12 * block)
                    blocks[block] = zlib.decompress(bzz[start:start + csize])
                verse = blocks[block][offset:offset + size].decode("utf-8", errors="replace")
                verses.append(osis_to_text(verse).strip(" "))
    text = " ".join(v for v in verses if v)
    text = re.sub(r" *\n+ *", "\n", text).strip() + "\n"
    with open(out_path, "w", encoding="utf-8") as f:
        f.write(text)
    print("%s: %d verses, %d words" % (out_path, len(verses), len(text.split())), file=sys.stderr)


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(root, ".cache", "corpus"))
    ap.add_argument("--deb", help="an already downloaded r-cran-janeaustenr .deb")
    ap.add_argument("--no-bible", action="store_true", help="skip the World English Bible")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    bible = os.path.join(args.out, "web_bible.txt")
    if not args.no_bible and not os.path.exists(bible):
        extract_bible(bible)
    if all(os.path.exists(os.path.join(args.out, n + ".txt")) for n in NOVELS):
        print(os.path.join(args.out, "persuasion.txt"))
        return
    with tempfile.TemporaryDirectory() as tmp:
        deb = args.deb or fetch_deb(tmp, "r-cran-janeaustenr")
        subprocess.run(["dpkg", "-x", deb, os.path.join(tmp, "x")], check=True)
        data = glob.glob(os.path.join(tmp, "x", "usr", "lib", "R", "site-library", "janeaustenr",
                                      "data"))[0]
        with open(os.path.join(data, "Rdata.rdx"), "rb") as f:
            index = unserialize(read_compressed(f.read()))
        with open(os.path.join(data, "Rdata.rdb"), "rb") as f:
            rdb = f.read()
    # index: list(variables = named list of c(offset, length), references, compressed)
    names = index.attrs.get("names") if isinstance(index, RVector) else None
    if names is None:
        raise SystemExit("unexpected Rdata.rdx layout")
    variables = index[names.index("variables")]
    var_names = variables.attrs["names"]
    for name, (offset, length) in zip(var_names, variables):
        if name not in NOVELS:
            continue
        obj = unserialize(read_compressed(rdb[offset:offset + length]))
        text = "\n".join("" if line is None else line for line in obj) + "\n"
        path = os.path.join(args.out, name + ".txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        print("%s: %d lines, %d words" % (path, len(obj), len(text.split())), file=sys.stderr)
    print(os.path.join(args.out, "persuasion.txt"))


if __name__ == "__main__":
    main()
