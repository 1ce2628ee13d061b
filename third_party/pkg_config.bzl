"""Repository rule: turns `pkg-config --libs` of system packages into linkopts."""

def _pkg_config_linkopts_impl(ctx):
    result = ctx.execute(["pkg-config", "--libs"] + ctx.attr.packages)
    if result.return_code != 0:
        fail("pkg-config failed for %s: %s" % (ctx.attr.packages, result.stderr))
    flags = [f for f in result.stdout.strip().split(" ") if f]
    ctx.file("WORKSPACE", "")
    ctx.file("BUILD", "")
    ctx.file("defs.bzl", "LINKOPTS = %s\n" % repr(flags))

pkg_config_linkopts = repository_rule(
    implementation = _pkg_config_linkopts_impl,
    attrs = {"packages": attr.string_list()},
    local = True,
)
