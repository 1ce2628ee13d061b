#!/usr/bin/perl
# Rewrites a .cu file (on stdin; its path for #line is the argument) so that
# g++ compiles it against testing/cuda_stand_in/ and its launchers run the
# kernels on the CPU (cuda_stand_in.h's Launch):
#   Kernel<T>  <<<grid, block, shared, stream>>>(args)
#     -> ::cuda_stand_in::Launch(grid, block, shared, stream)  (Kernel<T>, args)
#   extern __shared__ T name[];  -> T* const name = <the block's dynamic shared memory>;
#   __shared__ (a static one)    -> static (one at a time: the blocks run one after another)
# Whitespace and newlines stay where they were, so #line keeps the .cu's line
# numbers in diagnostics. Fails when a <<< or >>> is left.
use strict;
use warnings;

my $path = shift @ARGV;
local $/;
my $src = <STDIN>;

$src =~ s{\bextern(\s+)__shared__(\s+)([\w:]+)\s+(\w+)\s*\[\s*\]\s*;}
         {$1$2$3* const $4 = reinterpret_cast<$3*>(::cuda_stand_in::DynamicShared());}g;
$src =~ s{\b__shared__\b}{static}g;
my $launches = ($src =~ s{\b([A-Za-z_][\w:]*(?:<[^<>;{}()]*>)?)(\s*)<<<(.*?)>>>(\s*)\((\s*\))?}
                         {"::cuda_stand_in::Launch($3)$2$4($1" . (defined $5 ? $5 : ", ")}gse);
die "emulate_launches.pl: no launch in $path\n" if $launches == 0;
die "emulate_launches.pl: a <<< or >>> left in $path\n" if $src =~ /<<<|>>>/;
print "// Generated from $path by kernels/cuda/testing/emulate_launches.pl: do not edit.\n";
print "#include <cuda_runtime.h>\n";
print "#line 1 \"$path\"\n";
print $src;
