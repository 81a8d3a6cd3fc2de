"""libtriton.so replaced on disk after it was loaded (what `pip install -U triton` does under a
running notebook): the native module must read the loaded image, or refuse, never crash."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import triton

# The child imports Triton from a private tree of links to the installed package (so nothing
# installed is touched), then puts a decoy ELF where its libtriton.so was: a small file whose
# .symtab names the four LLVM functions the native module calls, at offsets inside libtriton's
# read-only first page. Symbols read from the path would send those calls there.
_CHILD = textwrap.dedent("""
    import os, struct, sys
    sys.path.insert(0, sys.argv[1])
    import triton._C.libtriton as libtriton
    assert libtriton.__file__.startswith(sys.argv[1]), libtriton.__file__

    names = [b"LLVMParseCommandLineOptions", b"_ZN4llvm2cl20getRegisteredOptionsERNS0_10SubCommandE",
             b"_ZN4llvm2cl10SubCommand11getTopLevelEv", b"_ZN4llvm2cl6Option5resetEv"]
    strtab = b"\\0" + b"".join(name + b"\\0" for name in names)
    symbols = [bytes(24)]
    offset = 1
    for name in names:
        symbols.append(struct.pack("<IBBHQQ", offset, 0x12, 0, 1, 0x40, 16))  # GLOBAL FUNC at 0x40
        offset += len(name) + 1
    symtab = b"".join(symbols)
    shoff = 64 + len(symtab) + len(strtab)
    header = (b"\\x7fELF\\x02\\x01\\x01" + bytes(9)
              + struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, shoff, 0, 64, 56, 0, 64, 3, 0))
    sections = (bytes(64)
                + struct.pack("<IIQQQQIIQQ", 0, 2, 0, 0, 64, len(symtab), 2, 1, 8, 24)
                + struct.pack("<IIQQQQIIQQ", 0, 3, 0, 0, 64 + len(symtab), len(strtab), 0, 0, 1, 0))
    os.remove(libtriton.__file__)
    with open(libtriton.__file__, "wb") as decoy:
        decoy.write(header + symtab + strtab + sections)

    import tritonpatch.llvm as llvm
    try:
        assert llvm.get_option("disable-lsr").type == "bool"
        assert llvm.get_option("unroll-threshold").type == "unsigned"
        print("read the loaded image")
    except llvm.NativeUnavailableError as exc:
        assert "replaced on disk" in str(exc) and "Supported:" not in str(exc), exc
        print("refused:", exc)
""")


def _private_triton(root: str) -> None:
    """``root/triton``: links to every file of the installed package, with real directories for
    ``triton/`` and ``triton/_C/`` so that libtriton.so's link can be replaced."""
    installed = os.path.dirname(triton.__file__)
    for name in os.listdir(installed):
        if name != "_C":
            os.makedirs(os.path.join(root, "triton"), exist_ok=True)
            os.symlink(os.path.join(installed, name), os.path.join(root, "triton", name))
    os.makedirs(os.path.join(root, "triton", "_C"))
    for name in os.listdir(os.path.join(installed, "_C")):
        os.symlink(os.path.join(installed, "_C", name), os.path.join(root, "triton", "_C", name))


def test_library_replaced_after_loading_is_never_read(tmp_path):
    _private_triton(str(tmp_path))
    child = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path)], capture_output=True, text=True,
                           timeout=300)
    assert child.returncode == 0, f"exit {child.returncode}:\n{child.stderr[-3000:]}"
    assert child.stdout.startswith(("read the loaded image", "refused:")), child.stdout
