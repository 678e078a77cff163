#!/usr/bin/env python3
"""Fail on a cycle between the modules of a Rust crate, naming it and the lines that close it.

    tools/module_cycles.py [--cfg-test] [--verbose] CRATE_DIR...     (e.g. crates/core crates/python)

Exit status 0 when no crate has a cycle, 1 when one has (each cycle is printed), 2 on a usage or
parse error. Standard library only; it reads `CRATE_DIR/src/lib.rs` (or `main.rs`) and every
file reached through `mod name;`, plus inline `mod name { ... }` blocks.

Why not `cargo modules dependencies --acyclic`: cargo-modules 0.28 needs rustc 1.98 and 0.27
(the last release for rustc 1.95) compiles rust-analyzer's crates; see the lead's notes in the
change that added this file for the measured cost. This script runs in well under a second.

What counts as an edge (module A depends on module B)
-----------------------------------------------------
Code *in A's own body* (A's file or inline block, not its child modules) names an item that is
*defined* in B. A name reaches B through

  * a `use` path:           use crate::transport::{Op, Transport};  use super::common::fill;
  * any other path in code: crate::reduce::reduce_into(..), super::Foo::new(), child::f(),
                            or a path through a module alias: `use crate::reduce as k; k::sum(..)`
    (paths starting with `crate`, `super`, `self`, a child module's name, or a name bound by a
    `use` to a module; paths into other crates, `std::` etc., are not edges).

Re-exports are followed to the item's definition: when `select/mod.rs` says
`pub use link_model::LinkModel;` and `policy.rs` says `use super::LinkModel;`, the edge is
policy -> link_model, not policy -> select. Glob imports (`use x::*`) are followed when the
name is not defined in the module itself.

What is NOT an edge:

  * `mod child;` / `mod child { .. }`: declaring a child is structure, not use.
  * a re-export (`pub use`, `pub(crate) use`, ...) whose name the module's own code does not
    also use: forwarding a child's item is structure too (the users of the re-export get the
    edge to the definition instead). A private `use` always counts (an unused one is a warning).
  * doc comments and intra-doc links (`[`x`](crate::a::X)`): comments are not code.
  * `#[cfg(test)]` items (the `mod tests`, test-only `use`s and helpers), unless --cfg-test.
  * paths in macro bodies that start with `$crate` (they belong to the expansion site).
  * `pub(in crate::a)` visibilities.

The rule for cycles
-------------------
For every module P (the crate root included) the script builds one graph whose nodes are P's
own body and each child subtree of P (child c stands for c and all its descendants), with an
edge X -> Y when code somewhere in X depends on an item defined somewhere in Y. A cycle in any
of these graphs fails the check. This covers

  * siblings at any depth: `algorithms::common` uses `algorithms::select` and `select` (or
    anything inside it) uses `common`; `transport` <-> `algorithms` at the top; and longer
    rings a -> b -> c -> a;
  * a parent and its child: a child using its parent's items (`use super::Foo`) is normal and
    is an edge child -> parent, but it is a cycle only when the parent's own body also uses
    an item of that child (`use child::Bar` that the parent's code calls, or `child::f()`).
    Merely declaring `mod child;` or re-exporting its items does not close the cycle.

Every cycle between two individual modules shows up in the graph of their closest common
ancestor, so nothing is missed by not checking the fine-grained module graph separately.

Limits (a text-level reader, not the compiler): macros are not expanded; a name is taken to be
used by a `pub use`-ing module when the identifier occurs in its own code (not after a `.`);
`#[path]` attributes are not supported (the script says so and stops).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field

# --------------------------------------------------------------------------------------------
# Tokenizer: identifiers, `::`, single punctuation characters; comments, strings, chars dropped.
# --------------------------------------------------------------------------------------------


@dataclass
class Tok:
    text: str
    line: int


IDENT_START = re.compile(r"[A-Za-z_]")
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
NUMBER = re.compile(r"[0-9][0-9A-Za-z_.]*")
RAW_STR = re.compile(r'(?:b|c)?r(#*)"')


def tokenize(src: str, fname: str) -> list[Tok]:
    toks: list[Tok] = []
    i, n, line = 0, len(src), 1
    while i < n:
        c = src[i]
        if c == "\n":
            line += 1
            i += 1
        elif c.isspace():
            i += 1
        elif src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
        elif src.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if src.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif src.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    line += src[i] == "\n"
                    i += 1
        elif (m := RAW_STR.match(src, i)) and (i == 0 or not src[i - 1].isalnum()):
            close = '"' + m.group(1)
            j = src.find(close, m.end())
            if j < 0:
                raise SyntaxError(f"{fname}:{line}: unterminated raw string")
            line += src.count("\n", i, j)
            i = j + len(close)
        elif c == '"' or (c in "bc" and src.startswith('"', i + 1)):
            i = i + 1 if c == '"' else i + 2
            while i < n and src[i] != '"':
                if src[i] == "\\":
                    i += 1
                line += src[i] == "\n"
                i += 1
            i += 1
        elif c == "'" or (c == "b" and src.startswith("'", i + 1)):
            # A char literal ('a', '\n', '\u{1F600}', b'x') or a lifetime ('a, 'static).
            k = i + 1 if c == "'" else i + 2
            if src.startswith("\\", k):
                j = src.find("'", k + 2)
                i = j + 1
            elif k + 1 < n and src[k + 1] == "'":
                i = k + 2
            else:  # a lifetime / label: drop the quote, the name follows as an identifier
                i = k
        elif IDENT_START.match(c):
            if src.startswith("r#", i) and IDENT_START.match(src[i + 2 : i + 3] or " "):
                i += 2  # raw identifier r#type
            m = IDENT.match(src, i)
            toks.append(Tok(m.group(0), line))
            i = m.end()
        elif c.isdigit():
            i = NUMBER.match(src, i).end()
        elif src.startswith("::", i):
            toks.append(Tok("::", line))
            i += 2
        else:
            toks.append(Tok(c, line))
            i += 1
    return toks


def is_ident(t: str) -> bool:
    return bool(IDENT.fullmatch(t))


OPEN = {"(": ")", "[": "]", "{": "}"}


def match_close(toks: list[Tok], i: int) -> int:
    """Index of the bracket closing the one at toks[i]."""
    depth = 0
    for j in range(i, len(toks)):
        t = toks[j].text
        if t in OPEN:
            depth += 1
        elif t in (")", "]", "}"):
            depth -= 1
            if depth == 0:
                return j
    raise SyntaxError(f"line {toks[i].line}: unbalanced {toks[i].text!r}")


# --------------------------------------------------------------------------------------------
# Modules: the tree, each module's own tokens, its `use` bindings and its definitions.
# --------------------------------------------------------------------------------------------

ModPath = tuple  # ("algorithms", "select") ; () is the crate root


@dataclass
class Binding:
    path: list  # the full use path, e.g. ["super", "link_model", "LinkModel"] or [..., "*"]
    name: str  # the name bound ("*" for a glob, "_" for `as _`)
    public: bool  # pub / pub(crate) / pub(super) / pub(in ..): a re-export
    line: int


@dataclass
class Module:
    path: ModPath
    file: str
    child_dir: str  # where `mod x;` looks for x.rs / x/mod.rs
    toks: list = field(default_factory=list)  # own body only
    use_spans: list = field(default_factory=list)  # (start, end) token ranges of `use` items
    children: dict = field(default_factory=dict)  # name -> ModPath
    bindings: dict = field(default_factory=dict)  # name -> [Binding]
    globs: list = field(default_factory=list)  # [Binding]
    defs: set = field(default_factory=set)
    used_idents: set = field(default_factory=set)  # identifiers in code outside `use` items


DEF_KW = {"fn", "struct", "enum", "trait", "type", "const", "static", "union", "mod"}


def attr_is_test(toks: list[Tok]) -> bool:
    """`#[cfg(test)]` / `#[cfg(all(test, ..))]` (toks: inside the brackets)."""
    s = "".join(t.text for t in toks)
    return s == "cfg(test)" or s.startswith("cfg(all(test")


class Crate:
    def __init__(self, crate_dir: str, cfg_test: bool):
        self.dir = crate_dir
        self.cfg_test = cfg_test
        self.mods: dict[ModPath, Module] = {}
        src = os.path.join(crate_dir, "src")
        for root in ("lib.rs", "main.rs"):
            if os.path.exists(os.path.join(src, root)):
                self.load_file((), os.path.join(src, root), src)
                break
        else:
            raise SystemExit(f"{crate_dir}: no src/lib.rs or src/main.rs")
        for m in self.mods.values():
            self.scan_uses(m)

    # -- the tree ----------------------------------------------------------------------------

    def load_file(self, path: ModPath, fname: str, child_dir: str) -> None:
        with open(fname, encoding="utf-8") as f:
            toks = tokenize(f.read(), fname)
        self.add_module(path, fname, child_dir, toks, 0, len(toks))

    def add_module(self, path, fname, child_dir, toks, start, end) -> None:
        m = Module(path, fname, child_dir)
        self.mods[path] = m
        i = start
        while i < end:
            t = toks[i].text
            if t == "#" and i + 1 < end and toks[i + 1].text in ("[", "!"):
                inner = toks[i + 1].text == "!"
                b = i + 2 if inner else i + 1
                close = match_close(toks, b)
                attr = toks[b + 1 : close]
                if attr and attr[0].text == "path":
                    raise SystemExit(f"{fname}:{toks[i].line}: #[path] is not supported")
                if not inner and not self.cfg_test and attr_is_test(attr):
                    i = self.skip_item(toks, close + 1, end)
                    continue
                m.toks.extend(toks[i : close + 1])
                i = close + 1
            elif t == "mod" and i + 2 < end and is_ident(toks[i + 1].text):
                name, nxt = toks[i + 1].text, toks[i + 2].text
                child = path + (name,)
                m.children[name] = child
                m.defs.add(name)
                if nxt == ";":
                    self.load_child_file(child, fname, child_dir, name, toks[i].line)
                    i += 3
                elif nxt == "{":
                    close = match_close(toks, i + 2)
                    self.add_module(
                        child, fname, os.path.join(child_dir, name), toks, i + 3, close
                    )
                    i = close + 1
                else:
                    m.toks.append(toks[i])
                    i += 1
            else:
                m.toks.append(toks[i])
                i += 1

    def load_child_file(self, child, parent_file, child_dir, name, line) -> None:
        for cand in (os.path.join(child_dir, name + ".rs"), os.path.join(child_dir, name, "mod.rs")):
            if os.path.exists(cand):
                self.load_file(child, cand, os.path.join(child_dir, name))
                return
        print(f"warning: {parent_file}:{line}: no file for `mod {name};`", file=sys.stderr)

    @staticmethod
    def skip_item(toks, i, end) -> int:
        """Index after the item starting at toks[i] (its attributes included)."""
        while i < end:
            t = toks[i].text
            if t == "#" and i + 1 < end and toks[i + 1].text == "[":
                i = match_close(toks, i + 1) + 1
            elif t in ("(", "["):
                i = match_close(toks, i) + 1
            elif t == ";":
                return i + 1
            elif t == "{":
                i = match_close(toks, i) + 1
                if i < end and toks[i].text == ";":
                    i += 1
                return i
            else:
                i += 1
        return end

    # -- `use` items, definitions, identifiers -----------------------------------------------

    def scan_uses(self, m: Module) -> None:
        toks = m.toks
        i = 0
        while i < len(toks):
            t = toks[i].text
            if t == "use" and (i == 0 or toks[i - 1].text not in (".", "::")):
                end = i
                while end < len(toks) and toks[end].text != ";":
                    end += 1
                start = i
                public = False
                if i > 0 and toks[i - 1].text == "pub":
                    public, start = True, i - 1
                elif i > 0 and toks[i - 1].text == ")":
                    j = i - 1
                    while j > 0 and toks[j].text != "(":
                        j -= 1
                    if j > 0 and toks[j - 1].text == "pub":
                        public, start = True, j - 1
                m.use_spans.append((start, end))
                for path, name, line in self.parse_use_tree(toks, i + 1, end):
                    b = Binding(path, name, public, line)
                    if name == "*":
                        m.globs.append(b)
                    else:
                        m.bindings.setdefault(name, []).append(b)
                i = end + 1
                continue
            if t in DEF_KW and i + 1 < len(toks) and is_ident(toks[i + 1].text):
                m.defs.add(toks[i + 1].text)
            elif t == "macro_rules" and i + 2 < len(toks) and toks[i + 1].text == "!":
                m.defs.add(toks[i + 2].text)
            i += 1
        in_use = self.use_mask(m)
        for k, tk in enumerate(toks):
            if not in_use[k] and is_ident(tk.text) and (k == 0 or toks[k - 1].text != "."):
                m.used_idents.add(tk.text)

    @staticmethod
    def use_mask(m: Module) -> list:
        mask = [False] * len(m.toks)
        for s, e in m.use_spans:
            for k in range(s, min(e + 1, len(m.toks))):
                mask[k] = True
        return mask

    @staticmethod
    def parse_use_tree(toks, i, end):
        """[(path, bound name, line)] for the use tree toks[i:end]."""
        out = []

        def tree(i, prefix):
            path = list(prefix)
            if i < end and toks[i].text == "::":
                i += 1
            while i < end:
                t = toks[i].text
                if t == "{":
                    close = match_close(toks, i)
                    j = i + 1
                    while j < close:
                        j = tree(j, path)
                        if j < close and toks[j].text == ",":
                            j += 1
                    return close + 1
                if t == "*":
                    out.append((path + ["*"], "*", toks[i].line))
                    return i + 1
                if not is_ident(t):
                    raise SyntaxError(f"line {toks[i].line}: unexpected {t!r} in a use tree")
                line = toks[i].line
                i += 1
                if i < end and toks[i].text == "::":
                    path.append(t)
                    i += 1
                    continue
                full, name = path + [t], t
                if t == "self":
                    full, name = path, path[-1] if path else "self"
                if i + 1 < end and toks[i].text == "as":
                    name = toks[i + 1].text
                    i += 2
                out.append((full, name, line))
                return i
            return i

        tree(i, [])
        return out

    # -- name resolution ---------------------------------------------------------------------

    def resolve(self, at: ModPath, segs: list, seen=None):
        """Resolve a path written in module `at`: ("mod", M) for a module, ("item", M) for an
        item defined in module M, or None when it leaves the crate or is not understood."""
        seen = set() if seen is None else seen
        if not segs:
            return None
        cur: ModPath
        first, rest = segs[0], segs[1:]
        if first == "crate":
            cur = ()
        elif first == "self":
            cur = at
        elif first == "super":
            cur = at
            while first == "super":
                if not cur:
                    return None
                cur = cur[:-1]
                if rest and rest[0] == "super":
                    first, rest = rest[0], rest[1:]
                else:
                    break
        else:
            cur, rest = at, segs  # a name in scope in `at`: child module or a `use` binding
        while rest:
            name, rest = rest[0], rest[1:]
            mod = self.mods.get(cur)
            if mod is None:
                return None
            if name in mod.children:
                cur = mod.children[name]
                continue
            target = self.lookup(cur, name, seen)
            if target is None:
                if name in mod.bindings or (cur == at and segs[0] not in ("crate", "self", "super")
                                            and name == segs[0]):
                    return None  # another crate's item, or a first segment naming another crate
                return ("item", cur)  # `crate::m::X` with X not found (a macro's item?): in m
            kind, where = target
            if kind == "mod":
                cur = where
                continue
            return target  # an item; what follows it (variants, methods) stays in its module
        return ("mod", cur)

    def lookup(self, at: ModPath, name: str, seen):
        """A name (not a child module) in module `at`: through its `use` bindings to where it
        is defined, else defined in `at` itself, else through its glob imports."""
        key = (at, name)
        if key in seen:
            return None
        seen = seen | {key}
        mod = self.mods[at]
        for b in mod.bindings.get(name, []):
            r = self.resolve(at, b.path, seen)
            if r is not None:
                return r
        if name in mod.defs:
            return ("item", at)
        for g in mod.globs:
            r = self.resolve(at, g.path[:-1], seen)
            if r and r[0] == "mod":
                inner = self.mods.get(r[1])
                if inner and (name in inner.defs or name in inner.bindings or name in inner.children):
                    found = self.resolve(r[1], [name], seen)
                    if found is not None:
                        return found
        return None  # bound to another crate's item (std::..), a prelude name, or unknown

    # -- edges -------------------------------------------------------------------------------

    def edges(self):
        """{(from, to): [(file, line, what)]}, modules as ModPath."""
        out = defaultdict(list)

        def add(m: Module, r, line, what):
            if r is None:
                return
            to = r[1]
            if to != m.path:
                out[(m.path, to)].append((m.file, line, what))

        for m in self.mods.values():
            # `use` items
            for name, bs in m.bindings.items():
                for b in bs:
                    if b.public and name not in m.used_idents:
                        continue  # a re-export only
                    r = self.resolve(m.path, b.path)
                    if r and r[0] == "mod":
                        continue  # a module alias: its uses in paths below make the edges
                    add(m, r, b.line, "use " + "::".join(b.path))
            for g in m.globs:
                if g.public:
                    continue
                r = self.resolve(m.path, g.path[:-1])
                if r:
                    add(m, r, g.line, "use " + "::".join(g.path))
            # other paths in code
            toks, in_use = m.toks, self.use_mask(m)
            k = 0
            while k < len(toks):
                t = toks[k].text
                if (
                    in_use[k]
                    or not is_ident(t)
                    or k + 2 >= len(toks)
                    or toks[k + 1].text != "::"
                    or (k > 0 and toks[k - 1].text in ("::", "$", "."))
                    or (k > 2 and toks[k - 1].text == "in" and toks[k - 2].text == "("
                        and toks[k - 3].text == "pub")
                ):
                    k += 1
                    continue
                if t not in ("crate", "super", "self") and not self.names_module(m, t):
                    k += 1
                    continue
                segs, j = [t], k + 1
                while j + 1 < len(toks) and toks[j].text == "::" and is_ident(toks[j + 1].text):
                    segs.append(toks[j + 1].text)
                    j += 2
                add(m, self.resolve(m.path, segs), toks[k].line, "::".join(segs))
                k = j
        return out

    def names_module(self, m: Module, name: str) -> bool:
        if name in m.children:
            return True
        if name in m.bindings:
            r = self.lookup(m.path, name, set())
            return bool(r and r[0] == "mod")
        return False


# --------------------------------------------------------------------------------------------
# Cycles
# --------------------------------------------------------------------------------------------


def sccs(nodes, succ):
    """Tarjan's strongly connected components with more than one node."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in succ.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def elementary_cycles(comp, succ, limit=20):
    """Up to `limit` simple cycles inside one component, each starting at its smallest node."""
    comp_set, cycles = set(comp), []
    for s in comp:
        stack = [(s, [s])]
        while stack and len(cycles) < limit:
            v, path = stack.pop()
            for w in sorted(succ.get(v, ()), reverse=True):
                if w not in comp_set or w < s:
                    continue
                if w == s:
                    cycles.append(path + [s])
                elif w not in path:
                    stack.append((w, path + [w]))
    return sorted(cycles, key=lambda c: (len(c), c))[:limit]


def check(crate: Crate, verbose: bool) -> int:
    edges = crate.edges()
    lines_cache: dict[str, list] = {}

    def src_line(f, n):
        if f not in lines_cache:
            with open(f, encoding="utf-8") as fh:
                lines_cache[f] = fh.read().splitlines()
        return lines_cache[f][n - 1].strip()

    def label(p: ModPath, own: bool) -> str:
        name = "crate" + "".join("::" + s for s in p)
        return name + " (own body)" if own else name

    found = 0
    for parent in sorted(crate.mods):
        depth = len(parent)
        # Nodes: ("own",) for parent's body, or the child's name for the child's subtree.
        succ: dict = defaultdict(set)
        evidence: dict = defaultdict(list)
        nodes = {("own",)} | {(c,) for c in crate.mods[parent].children}
        for (a, b), ev in edges.items():
            if a[:depth] != parent or b[:depth] != parent:
                continue
            na = ("own",) if len(a) == depth else (a[depth],)
            nb = ("own",) if len(b) == depth else (b[depth],)
            if na == nb:
                continue
            succ[na].add(nb)
            evidence[(na, nb)].extend((a, b, e) for e in ev)
        for comp in sccs(nodes, succ):
            found += 1

            def name(n):
                return label(parent, True) if n == ("own",) else label(parent + n, False)

            members = ", ".join(name(n) for n in comp)
            print(f"{crate.dir}: module cycle under {label(parent, False)}: {members}")
            for cyc in elementary_cycles(comp, succ):
                print("  cycle: " + " -> ".join(name(n) for n in cyc))
            comp_set = set(comp)
            for (na, nb), ev in sorted(evidence.items()):
                if na not in comp_set or nb not in comp_set:
                    continue
                print(f"  {name(na)} -> {name(nb)}:")
                by_line: dict = defaultdict(set)  # (file, line) -> {target module}
                for a, b, (f, ln, what) in ev:
                    by_line[(f, ln)].add(label(b, False))
                shown = sorted(by_line.items())
                limit = None if verbose else 6
                for (f, ln), targets in shown[:limit]:
                    print(f"    {f}:{ln}: {src_line(f, ln)}    [-> {', '.join(sorted(targets))}]")
                if limit and len(shown) > limit:
                    print(f"    ... and {len(shown) - limit} more (--verbose lists all)")
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("crates", nargs="+", help="crate directories (with src/lib.rs)")
    ap.add_argument("--cfg-test", action="store_true", help="include #[cfg(test)] items")
    ap.add_argument("--verbose", action="store_true", help="list every line of each edge")
    ap.add_argument("--edges", action="store_true", help="print the module dependency edges")
    args = ap.parse_args()
    total = 0
    for d in args.crates:
        try:
            crate = Crate(d.rstrip("/"), args.cfg_test)
        except SyntaxError as e:
            print(f"{d}: cannot parse: {e}", file=sys.stderr)
            return 2
        if args.edges:
            for (a, b), ev in sorted(crate.edges().items()):
                print("crate" + "".join("::" + s for s in a), "->",
                      "crate" + "".join("::" + s for s in b), f"({len(ev)})")
        total += check(crate, args.verbose)
    if total:
        print(f"{total} module cycle(s): break each by moving the shared items into a module "
              "both sides may depend on", file=sys.stderr)
        return 1
    print(f"module cycles: none in {' '.join(args.crates)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
