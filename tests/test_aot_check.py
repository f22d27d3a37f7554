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


def test_the_table_check_follows_each_kernels_fitting_and_fails_where_no_launch_fits(monkeypatch, tmp_path, capsys):
    """--tables: each tuned entry compiled as tuned; one over the block's shared memory is followed
    down its kernel's smaller_launch (the launches the kernel's fitting tries) to the first that
    fits; an entry where none fits, or a compile that fails, is a failure. Here a stand-in compiler
    charges 64 KB a pipeline stage (skinny), 2 KB a cache slot (attention)."""
    import json

    import pytest

    import tools.aot_check as aot

    table = {"skinny:N=64,K=256,T=16": {"block_n": 16, "block_k": 64, "num_stages": 5, "split": 1, "use": True},
             "attention:G=8,D=128,T=16": {"BLOCK_N": 128, "num_warps": 4, "target_programs": 64},
             "route:E=128,T=16": {"num_warps": 8, "TB": 16}}  # no tiles through shared memory: not listed
    (tmp_path / "GPU_A.json").write_text(json.dumps(table))
    (tmp_path / "default.json").write_text("{}")
    monkeypatch.setattr(aot, "CONFIG_DIR", tmp_path)
    monkeypatch.setattr(aot, "load_configs", lambda name: json.loads((tmp_path / f"{name}.json").read_text()))

    def compile_case(case, target):
        kernel, _, _, consts, opts = case
        need = opts["num_stages"] * 64 * 1024 if kernel is aot._skinny_kernel else consts["BLOCK_N"] * 2048
        return type("K", (), {"metadata": type("M", (), {"shared": need})})

    monkeypatch.setattr(aot, "compile_case", compile_case)
    target = aot.GPUTarget("cuda", 90, 32)
    assert aot.check_tables(target, threads=1) == 0
    out = capsys.readouterr().out
    skinny_lines = [line for line in out.splitlines() if "skinny:" in line]
    assert len(skinny_lines) == 2  # bf16 and float32
    assert "320 KB, over 227 KB: fitted to SkinnyLaunch(block_n=16, block_k=64, num_stages=3" in skinny_lines[0]
    assert "256 KB, over 227 KB: fitted to AttentionLaunch(block_n=64" in out
    assert "route:" not in out and "4 launches of 1 tables (GPU_A); 0 failed" in out

    monkeypatch.setattr(aot.attention, "smaller_launch", lambda launch: None)  # nothing smaller to try
    assert aot.check_tables(target, threads=1) == 2
    assert "FAILED: no launch fits (256 KB against 227 KB)" in capsys.readouterr().out
    import sys

    monkeypatch.setattr(sys, "argv", ["aot_check", "--tables", "--arch", "80"])
    monkeypatch.setattr(aot, "check_tables", lambda *a: pytest.fail("an unknown --arch must be refused first"))
    with pytest.raises(SystemExit) as exit_:
        aot.main()
    assert exit_.value.code == 2 and "--tables knows the shared memory of sm_90 only, got --arch 80" in capsys.readouterr().err
