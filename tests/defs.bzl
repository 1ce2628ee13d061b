"""A shell test that drives the strata tool over one program and strategy."""

def strata_sh_test(name, program = "//examples:mlp_pp2.pbtxt", strategy = "//examples:pp2.strategy.pbtxt", data = [], **kwargs):
    """sh_test NAME.sh called as `NAME.sh STRATA PROGRAM STRATEGY` (`data`: more files it reads)."""
    native.sh_test(
        name = name,
        srcs = [name + ".sh"],
        args = [
            "$(location //tools:strata)",
            "$(location %s)" % program,
            "$(location %s)" % strategy,
        ],
        data = [program, strategy, "//tools:strata", "//tests:job_lib.sh"] + data,
        **kwargs
    )
