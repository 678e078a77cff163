"""Fails when a wheel's extension needs a symbol from no library version: what auditwheel
does not check. The libc functions a manylinux wheel calls carry the glibc version they were
linked against (``memcpy@GLIBC_2.17``); one that the old glibc it targets lacks (``gettid``
came in 2.30) stays unversioned, auditwheel passes the wheel, and the import fails there
("undefined symbol"). Python's C API (``Py*``) is unversioned by design: found in the
interpreter.

    python tools/unversioned_symbols.py WHEEL...

Run by ./dev with the venv's python (pyelftools comes with auditwheel).
"""

from __future__ import annotations

import io
import sys
import zipfile

from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerSymSection
from elftools.elf.sections import SymbolTableSection

#: Version indices that name no library version.
UNVERSIONED = ("VER_NDX_LOCAL", "VER_NDX_GLOBAL")


def unversioned(elf: ELFFile) -> list[str]:
    """The strong undefined symbols of `elf` with no version, Python's own aside."""
    dynsym = elf.get_section_by_name(".dynsym")
    if not isinstance(dynsym, SymbolTableSection):
        return []
    versym = next((s for s in elf.iter_sections() if isinstance(s, GNUVerSymSection)), None)
    found = []
    for i, sym in enumerate(dynsym.iter_symbols()):
        if (sym["st_shndx"] != "SHN_UNDEF" or sym["st_info"]["bind"] != "STB_GLOBAL"
                or not sym.name or sym.name.startswith(("Py", "_Py"))):
            continue
        if versym is None or versym.get_symbol(i)["ndx"] in UNVERSIONED:
            found.append(sym.name)
    return found


def main() -> None:
    bad = []
    for wheel in sys.argv[1:]:
        with zipfile.ZipFile(wheel) as z:
            for name in z.namelist():
                if name.endswith(".so"):
                    bad += [f"{wheel}: {name}: {s}"
                            for s in unversioned(ELFFile(io.BytesIO(z.read(name))))]
    if bad:
        sys.exit("symbols from no glibc version (the wheel will not load where glibc lacks "
                 "them; call the system call instead):\n  " + "\n  ".join(bad))


if __name__ == "__main__":
    main()
