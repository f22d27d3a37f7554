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
