#!/usr/bin/env python3
"""cuda_to_host.py: rewrite the two CUDA constructs a host C++ compiler cannot parse, and nothing else.

    cuda_to_host.py IN OUT

  kernel<<<grid, block, smem, stream>>>(args)   ->  ::emu::Launch("kernel", grid, block, smem, stream).run(kernel, args)
  __shared__ T a[N], b[M];                      ->  T (&a)[N] = *(T(*)[N])::emu::shared_static(&site, sizeof(T[N]), alignof(T)); ...
  extern __shared__ __align__(A) T s[];         ->  T* const s = (T*)::emu::shared_dynamic(A);

Every newline is kept where it was, so the compiler's line numbers and __LINE__ are the source's. Anything
else that looks like a launch or a __shared__ declaration but does not parse is an error naming the line,
never passed through (tests/emu/include/cuda_runtime.h also makes a leftover __shared__ fail to compile).
"""
import re
import sys

IDENT = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")


def fail(src, pos, why):
    line = src.count("\n", 0, pos) + 1
    sys.exit("cuda_to_host.py: line %d: %s" % (line, why))


def match_back(src, end, open_ch, close_ch):
    """Index of the open_ch matching the close_ch at src[end]."""
    depth = 0
    for i in range(end, -1, -1):
        if src[i] == close_ch:
            depth += 1
        elif src[i] == open_ch:
            depth -= 1
            if depth == 0:
                return i
    return -1


def match_forward(src, start, open_ch, close_ch):
    """Index just past the close_ch matching the open_ch at src[start]."""
    depth = 0
    for i in range(start, len(src)):
        if src[i] == open_ch:
            depth += 1
        elif src[i] == close_ch:
            depth -= 1
            if depth == 0:
                return i + 1
    return -1


def kernel_start(src, lt):
    """Start of the kernel expression before '<<<' at lt: an identifier, possibly qualified, with template args."""
    i = lt - 1
    while i >= 0 and src[i] in " \t":
        i -= 1
    if i >= 0 and src[i] == ">":
        i = match_back(src, i, "<", ">")
        if i < 0:
            fail(src, lt, "unbalanced template arguments before <<<")
        i -= 1
    while i >= 0 and (src[i].isalnum() or src[i] in "_:"):
        i -= 1
    start = i + 1
    if not IDENT.match(src, start.__index__()) and not src.startswith("::", start):
        fail(src, lt, "no kernel name before <<<")
    return start


def rewrite_launches(src):
    out, pos = [], 0
    while True:
        lt = src.find("<<<", pos)
        if lt < 0:
            out.append(src[pos:])
            return "".join(out)
        gt = src.find(">>>", lt)
        if gt < 0:
            fail(src, lt, "<<< without >>>")
        start = kernel_start(src, lt)
        kernel = src[start:lt].rstrip()
        paren = gt + 3
        while paren < len(src) and src[paren] in " \t":
            paren += 1
        if paren >= len(src) or src[paren] != "(":
            fail(src, gt, "no argument list after >>>")
        end = match_forward(src, paren, "(", ")")
        if end < 0:
            fail(src, paren, "unbalanced argument list after >>>")
        args = src[paren + 1:end - 1]
        name = re.sub(r"\s+", " ", kernel).replace('"', '\\"')
        out.append(src[pos:start])
        out.append('::emu::Launch("%s", %s).run(%s%s%s)' % (name, src[lt + 3:gt], kernel,
                                                             ", " if args.strip() else "", args))
        pos = end


SHARED = re.compile(r"(extern\s+)?__shared__\s+((?:__align__\s*\(\s*\d+\s*\)\s*)?)([^;]*);")
ALIGN = re.compile(r"__align__\s*\(\s*(\d+)\s*\)")
DECL = re.compile(r"\s*([A-Za-z_][A-Za-z_0-9]*)\s*((?:\[[^\]]*\]\s*)*)$")


def split_top(text):
    """Split at commas outside brackets and parentheses."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "([<":
            depth += 1
        elif ch in ")]>":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return parts


def rewrite_shared(src):
    def one(m):
        is_extern, align_txt, body = m.group(1), m.group(2), m.group(3)
        newlines = "\n" * m.group(0).count("\n")
        am = ALIGN.search(align_txt)
        decls = split_top(body)
        first = re.match(r"\s*((?:const\s+|volatile\s+|unsigned\s+|signed\s+|long\s+)*[A-Za-z_][A-Za-z_0-9:]*(?:\s*<[^>]*>)?)\s+(.*)$",
                         decls[0], re.S)
        if not first:
            fail(src, m.start(), "cannot read the type of a __shared__ declaration")
        typ, decls[0] = first.group(1).strip(), first.group(2)
        align = am.group(1) if am else "alignof(%s)" % typ
        line = src.count("\n", 0, m.start()) + 1
        out = []
        for d in decls:
            dm = DECL.match(d)
            if not dm:
                fail(src, m.start(), "cannot read the __shared__ declarator '%s'" % d.strip())
            name, dims = dm.group(1), re.sub(r"\s+", "", dm.group(2))
            if is_extern:
                if dims != "[]":
                    fail(src, m.start(), "extern __shared__ %s must be an array of unknown size" % name)
                out.append("%s* const %s = (%s*)::emu::shared_dynamic(%s);" % (typ, name, typ, align))
                continue
            if "[]" in dims:
                fail(src, m.start(), "__shared__ %s has an array dimension without a size" % name)
            site = "emu_site_%d_%s" % (line, name)
            out.append("static const char %s = 0; %s (&%s)%s = *(%s(*)%s)::emu::shared_static(&%s, sizeof(%s%s), %s);"
                       % (site, typ, name, dims, typ, dims, site, typ, dims, align))
        return " ".join(out) + newlines

    return SHARED.sub(one, src)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: cuda_to_host.py IN OUT")
    with open(sys.argv[1]) as f:
        src = f.read()
    out = rewrite_shared(rewrite_launches(src))
    if "<<<" in out or re.search(r"\b__shared__\b", out.replace("__shared__was_not", "")):
        sys.exit("cuda_to_host.py: %s: a launch or __shared__ was left unrewritten" % sys.argv[1])
    with open(sys.argv[2], "w") as f:
        f.write(out)


if __name__ == "__main__":
    main()
