"""tools/aot_check.py's SASS listing (what a refactor's byte-identical check diffs)."""


def test_the_sass_listing_keeps_instructions_past_the_first_64_kib(monkeypatch):
    """cuobjdump writes each instruction's address as /*xxxx*/, with a fifth hex digit from the
    4,097th instruction on: those instructions are listed too, without addresses or line info."""
    import tools.aot_check as aot

    dump = "\n".join(["        /*0000*/                   MOV R1, c[0x0][0x28] ;   /* 0x000 */",
                      "        /*fff0*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;",
                      "        /*10000*/                  EXIT ;                  /* 0x001 */",
                      "        .headerflags    @\"EF_CUDA_SM90\""])
    monkeypatch.setattr(aot, "cuobjdump", lambda cubin, flag: dump)
    assert aot.sass(b"") == "MOV R1, c[0x0][0x28]\nBAR.SYNC.DEFER_BLOCKING 0x0\nEXIT\n"


def test_threaded_compiles_report_every_case_in_order_and_a_bad_thread_count_is_refused(monkeypatch, capsys):
    """--threads N compiles the cases side by side: each case's line in the cases' order, a failed
    compile reported on its own line (the others still listed), the exit status 1; --threads 0 is
    refused with the valid range before anything compiles."""
    import sys

    import pytest

    import tools.aot_check as aot

    names = [f"case {i}" for i in range(5)]
    monkeypatch.setattr(aot, "cases", lambda: [(n, aot._decode_attention, {}, (), {}, {}) for n in names])
    monkeypatch.setattr(aot, "_types", lambda *a, **k: ({}, {}))
    monkeypatch.setattr(aot, "ASTSource", lambda **kw: kw)

    class Compiled:
        def __init__(self) -> None:
            self.asm = {"ptx": "", "cubin": b""}
            self.metadata = type("M", (), {"shared": 0})

    calls = []

    def compile_(src, target, options):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("boom")
        return Compiled()

    monkeypatch.setattr(aot.triton, "compile", compile_)
    monkeypatch.setattr(aot, "resources", lambda cubin: "regs=1")
    monkeypatch.setattr(sys, "argv", ["aot_check", "--threads", "2"])
    with pytest.raises(SystemExit) as exit_:
        aot.main()
    out = capsys.readouterr().out.splitlines()
    assert exit_.value.code == 1 and len(calls) == 5
    listed = [line for line in out if line.startswith("case ")]
    assert [line.split()[1] for line in listed] == ["0", "1", "2", "3", "4"]
    assert sum("FAILED: RuntimeError: boom" in line for line in listed) == 1
    assert out[-1].startswith("5 cases compiled in")
    monkeypatch.setattr(sys, "argv", ["aot_check", "--threads", "0"])
    calls.clear()
    with pytest.raises(SystemExit) as exit_:
        aot.main()
    assert exit_.value.code == 2 and "--threads must be >= 1, got 0" in capsys.readouterr().err and not calls
