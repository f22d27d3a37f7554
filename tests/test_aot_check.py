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
    """--tables: each tuned entry compiled at each token tile that reads it (a 16-token bucket also
    serves 32 tokens, in a tile of 32), in bf16 and float32; one over the block's shared memory is
    followed down its kernel's smaller_launch (the launches the kernel's fitting tries) to the first
    that fits; an entry where none fits, or a compile that fails, is a failure. A stand-in compiler
    charges 16 KB a stage per 16 tokens of tile (skinny), 2 KB a cache slot (attention), 1 KB a stage
    per reduction row (experts; the one-launch FFN both its tiles'). The one-launch FFN has nothing
    smaller: where it does not fit, the two launches run instead, which is no failure."""
    import json
    import re
    import sys

    import pytest

    import tools.aot_check as aot

    table = {"skinny:N=64,K=256,T=16": {"block_n": 16, "block_k": 64, "num_stages": 5, "split": 1, "use": True},
             "attention:G=8,D=128,T=16": {"BLOCK_N": 128, "num_warps": 4, "target_programs": 64},
             # the experts at 64 tokens: v3 taken (kept bound 16), its down launch too large as tuned
             "H=64,I=32,T=64": {"gate_up": {"BH": 64, "num_stages": 2}, "down": {"BI": 32, "num_stages": 2},
                                "gate_up_kept": {"BH": 64, "num_stages": 2}, "down_kept": {"BI": 256, "num_stages": 2},
                                "kept_max": 16},
             "route:E=128,T=16": {"num_warps": 8, "TB": 16}}  # no tiles through shared memory: not listed
    (tmp_path / "GPU_A.json").write_text(json.dumps(table))
    (tmp_path / "default.json").write_text("{}")
    monkeypatch.setattr(aot, "CONFIG_DIR", tmp_path)
    monkeypatch.setattr(aot, "load_configs", lambda name: json.loads((tmp_path / f"{name}.json").read_text()))
    reduce_rows = {aot._gate_up_kernel: "BH", aot._gate_up_kept_kernel: "BH", aot._down_kernel: "BI",
                   aot._down_kept_kernel: "BI"}

    def compile_case(case, target):
        kernel, _, _, consts, opts = case
        if kernel is aot._skinny_kernel:
            need = opts["num_stages"] * consts["TB"] * 1024
        elif kernel is aot._decode_attention:
            need = consts["BLOCK_N"] * 2048
        elif kernel is aot._ffn_kernel:
            need = (opts["num_stages"] * consts["BH"] + consts["STAGES_D"] * consts["BI_D"]) * 1024
        else:
            need = opts["num_stages"] * consts[reduce_rows[kernel]] * 1024
        return type("K", (), {"metadata": type("M", (), {"shared": need})})

    monkeypatch.setattr(aot, "compile_case", compile_case)
    target = aot.GPUTarget("cuda", 90, 32)
    monkeypatch.setattr(aot, "SHARED_LIMIT", {90: 64 * 1024})
    assert aot.check_tables(target, threads=1) == 0
    out = capsys.readouterr().out
    lines = {}  # "dtype label" -> the result
    for line in out.splitlines():
        m = re.match(r"GPU_A\s+(\w+)\s+(.*?)\s+(\d+ KB.*)$", line)
        if m:
            lines[f"{m[1]} {m[2]}"] = m[3]
    assert lines["bf16 skinny:N=64,K=256,T=16 TB=16"].startswith(
        "80 KB, over 64 KB: fitted to SkinnyLaunch(block_n=16, block_k=64, num_stages=4")
    # the same bucket at 32 tokens: twice the tile, two stages at most
    assert "fitted to SkinnyLaunch(block_n=16, block_k=64, num_stages=2" in lines["bf16 skinny:N=64,K=256,T=16 TB=32"]
    assert lines["fp32 attention:G=8,D=128,T=16"].startswith("256 KB, over 64 KB: fitted to AttentionLaunch(block_n=32")
    # the experts: the four-launch path once, its gate_up and the one-launch FFN also at each block of pairs it routes
    # (up to 16 tokens at top-8), v3 (its kept bound takes it) at each token tile up to 64, all from
    # the one bucket; v3's down: two stages of 256 rows, then one, then 128, then 64 rows
    assert sorted(key for key in lines if key.startswith("bf16 H=")) == sorted(
        ["bf16 H=64,I=32,T=64 gate_up", "bf16 H=64,I=32,T=64 down"]
        + [f"bf16 H=64,I=32,T=64 gate_up ROUTE_IN PB={pb}" for pb in (8, 16, 32, 64, 128)]
        + [f"bf16 H=64,I=32,T=64 ffn PB={pb}" for pb in (8, 16, 32, 64, 128)]
        + [f"bf16 H=64,I=32,T=64 {part} T_BLOCK={tb}" for part in ("gate_up_kept", "down_kept") for tb in (16, 32, 64)])
    down_kept = lines["bf16 H=64,I=32,T=64 down_kept T_BLOCK=16"]
    assert down_kept.startswith("512 KB, over 64 KB: fitted to {") and "'BI': 64, 'num_warps': 4, 'num_stages': 1}" in down_kept
    assert lines["bf16 H=64,I=32,T=64 gate_up_kept T_BLOCK=16"] == "128 KB, over 64 KB: fitted to " \
        "{'BI': 32, 'BH': 64, 'num_warps': 4, 'num_stages': 1, 'PER_SM': 3} (64 KB)"
    assert lines["bf16 H=64,I=32,T=64 ffn PB=128"] == "192 KB, over 64 KB: the two launches run instead"
    assert "route:" not in out and "0 failed" in out

    monkeypatch.setattr(aot.attention, "smaller_launch", lambda launch: None)  # nothing smaller to try
    assert aot.check_tables(target, threads=1) == 2
    assert "FAILED: no launch fits (256 KB against 64 KB)" in capsys.readouterr().out

    monkeypatch.setattr(sys, "argv", ["aot_check", "--tables", "--arch", "80"])
    monkeypatch.setattr(aot, "check_tables", lambda *a: pytest.fail("an unknown --arch must be refused first"))
    with pytest.raises(SystemExit) as exit_:
        aot.main()
    assert exit_.value.code == 2 and "--tables knows the shared memory of sm_90 only, got --arch 80" in capsys.readouterr().err
