#!/bin/bash
# Writes the crafted data folders of the bad-input corpus under $1, one folder
# per case: IDX datasets in the mnist:path=DIR layout (2x2 images, so they fit
# the [-1, 4] feed of good_program.pbtxt), uint16 token files for
# good_tokens.pbtxt and checkpoints for --load (the
# safetensors layout of good_program.pbtxt's parameters). A good folder of each
# kind is the control. Bytes are written with printf octal escapes so the
# corpus stays reviewable text.
set -euo pipefail
out="$1"

# IDX headers: magic 00 00 08 <rank>, then big-endian uint32 dims.
images_header() {  # count rows cols
  printf '\000\000\010\003'
  printf "\\$(printf %03o $(($1 >> 24 & 255)))\\$(printf %03o $(($1 >> 16 & 255)))"
  printf "\\$(printf %03o $(($1 >> 8 & 255)))\\$(printf %03o $(($1 & 255)))"
  printf "\000\000\000\\$(printf %03o "$2")\000\000\000\\$(printf %03o "$3")"
}
labels_header() {  # count
  printf "\000\000\010\001\000\000\000\\$(printf %03o "$1")"
}
pixels() {  # n bytes of pixel data
  head -c "$1" /dev/zero | tr '\000' '\200'
}
# Three samples with labels 0, 1, 2 (the good folder).
good_images() { images_header 3 2 2; pixels 12; }
good_labels() { labels_header 3; printf '\000\001\002'; }

case_dir() {
  mkdir -p "$out/$1"
  echo "$out/$1"
}

d=$(case_dir good)
good_images > "$d/train-images-idx3-ubyte"
good_labels > "$d/train-labels-idx1-ubyte"

# gzip'd files are read transparently (the Debian dataset ships them so).
d=$(case_dir good_gz)
good_images | gzip -n -c > "$d/train-images-idx3-ubyte.gz"
good_labels | gzip -n -c > "$d/train-labels-idx1-ubyte.gz"

# The header promises 12 pixel bytes; the file stops after 7.
d=$(case_dir truncated_images)
{ images_header 3 2 2; pixels 7; } > "$d/train-images-idx3-ubyte"
good_labels > "$d/train-labels-idx1-ubyte"

# The file stops inside the dims of the header.
d=$(case_dir truncated_header)
{ printf '\000\000\010\003\000\000\000'; } > "$d/train-images-idx3-ubyte"
good_labels > "$d/train-labels-idx1-ubyte"

# Two bytes: not even the magic number.
d=$(case_dir truncated_magic)
printf '\000\000' > "$d/train-images-idx3-ubyte"
good_labels > "$d/train-labels-idx1-ubyte"

# A gzip stream cut in the middle.
d=$(case_dir truncated_gz)
good_images | gzip -n -c > "$d/full.gz"
head -c 20 "$d/full.gz" > "$d/train-images-idx3-ubyte.gz"
rm "$d/full.gz"
good_labels | gzip -n -c > "$d/train-labels-idx1-ubyte.gz"

# The label file is empty.
d=$(case_dir empty_labels)
good_images > "$d/train-images-idx3-ubyte"
: > "$d/train-labels-idx1-ubyte"

# Label 10 in a 10-class dataset.
d=$(case_dir labels_out_of_range)
good_images > "$d/train-images-idx3-ubyte"
{ labels_header 3; printf '\000\012\002'; } > "$d/train-labels-idx1-ubyte"

# Label 7 is a valid Fashion-MNIST class but the program has only 3 classes.
d=$(case_dir labels_beyond_program_classes)
good_images > "$d/train-images-idx3-ubyte"
{ labels_header 3; printf '\000\007\002'; } > "$d/train-labels-idx1-ubyte"

# Three images, two labels.
d=$(case_dir count_mismatch)
good_images > "$d/train-images-idx3-ubyte"
{ labels_header 2; printf '\000\001'; } > "$d/train-labels-idx1-ubyte"

# A zip file's magic.
d=$(case_dir bad_magic)
printf 'PK\003\004not an idx file' > "$d/train-images-idx3-ubyte"
good_labels > "$d/train-labels-idx1-ubyte"

# Element type 0x0D (float32) instead of 0x08 (unsigned byte).
d=$(case_dir float_elements)
{ printf '\000\000\015\003\000\000\000\003\000\000\000\002\000\000\000\002'; pixels 48; } > "$d/train-images-idx3-ubyte"
good_labels > "$d/train-labels-idx1-ubyte"

# One byte more than the dims describe.
d=$(case_dir trailing_bytes)
{ good_images; printf '\000'; } > "$d/train-images-idx3-ubyte"
good_labels > "$d/train-labels-idx1-ubyte"

# Dims of 2^32-1 each: the reader must refuse before allocating.
d=$(case_dir absurd_dims)
printf '\000\000\010\003\377\377\377\377\377\377\377\377\377\377\377\377' > "$d/train-images-idx3-ubyte"
good_labels > "$d/train-labels-idx1-ubyte"

# Zero images.
d=$(case_dir zero_count)
images_header 0 2 2 > "$d/train-images-idx3-ubyte"
labels_header 0 > "$d/train-labels-idx1-ubyte"

# An image file of rank 1.
d=$(case_dir images_rank1)
{ printf '\000\000\010\001\000\000\000\003'; pixels 3; } > "$d/train-images-idx3-ubyte"
good_labels > "$d/train-labels-idx1-ubyte"

# 3x3 images do not fit the program's [-1, 4] feed.
d=$(case_dir wrong_image_size)
{ images_header 3 3 3; pixels 27; } > "$d/train-images-idx3-ubyte"
good_labels > "$d/train-labels-idx1-ubyte"

# Images but no label file.
d=$(case_dir missing_labels)
good_images > "$d/train-images-idx3-ubyte"

# --- token files (--data tokens:path=FILE, for good_tokens.pbtxt: windows of 5, vocab 8) ---
# Little-endian uint16 ids, two bytes each.
d=$(case_dir tokens)
# Three windows of 5 ids below 8, then 2 ids the windows leave out.
printf '\001\000\002\000\003\000\004\000\005\000%.0s' 1 2 3 > "$d/good.u16"
printf '\006\000\007\000' >> "$d/good.u16"
# Seven bytes: not whole uint16 ids.
printf '\001\000\002\000\003\000\004' > "$d/odd.u16"
# Three ids, fewer than one window of 5.
printf '\001\000\002\000\003\000' > "$d/short.u16"
# Id 9 at position 2, past the program's vocab 8.
printf '\001\000\002\000\011\000\004\000\005\000' > "$d/large_id.u16"

# --- checkpoints (--load DIR reads DIR/model.safetensors) ----------------------
# safetensors: little-endian uint64 header length, a JSON header, the data.
le64() {
  local n=$1 i
  for i in 0 1 2 3 4 5 6 7; do printf "\\$(printf %03o $((n >> (8 * i) & 255)))"; done
}
checkpoint() {  # header-json data-bytes
  le64 ${#1}
  printf '%s' "$1"
  head -c "$2" /dev/zero
}
meta() {  # batch_size
  echo "\"__metadata__\":{\"batch_size\":\"$1\",\"data_position\":\"64\",\"epoch\":\"0\",\"program\":\"tiny\",\"seed\":\"0\",\"step\":\"1\"}"
}
step='"@step":{"dtype":"I64","shape":[],"data_offsets":[0,8]}'
bias='"b":{"dtype":"F32","shape":[3],"data_offsets":[8,20]}'
weight='"w":{"dtype":"F32","shape":[4,3],"data_offsets":[20,68]}'

d=$(case_dir ckpt_good)
checkpoint "{$(meta 64),$step,$bias,$weight}" 68 > "$d/model.safetensors"

# The data section stops 20 bytes short.
d=$(case_dir ckpt_truncated)
checkpoint "{$(meta 64),$step,$bias,$weight}" 48 > "$d/model.safetensors"

# w saved as [3, 4]; the program has [4, 3].
d=$(case_dir ckpt_shape_mismatch)
checkpoint "{$(meta 64),$step,$bias,${weight/\[4,3\]/[3,4]}}" 68 > "$d/model.safetensors"

# A larger program's: a weight 'w2' the program has no var for, beside
# its optimizer state (which, with '@' in its name, another run may hold).
d=$(case_dir ckpt_other_program)
extra='"w2":{"dtype":"F32","shape":[3],"data_offsets":[68,80]},"w2@moment1":{"dtype":"F32","shape":[3],"data_offsets":[80,92]}'
checkpoint "{$(meta 64),$step,$bias,$weight,$extra}" 92 > "$d/model.safetensors"

# No tensor for the parameter w.
d=$(case_dir ckpt_missing_param)
checkpoint "{$(meta 64),$step,$bias}" 20 > "$d/model.safetensors"

# The optimizer's update count @step is -5 (the run's step is 1).
d=$(case_dir ckpt_negative_update_count)
header="{$(meta 64),$step,$bias,$weight}"
{ le64 ${#header}; printf '%s' "$header"; printf '\373\377\377\377\377\377\377\377'; head -c 60 /dev/zero; } \
  > "$d/model.safetensors"

# w's element 4 is NaN (0x7fc00000, little-endian): a diverged run's save.
d=$(case_dir ckpt_nan_weight)
header="{$(meta 64),$step,$bias,$weight}"
{ le64 ${#header}; printf '%s' "$header"; head -c 36 /dev/zero; printf '\000\000\300\177'; head -c 28 /dev/zero; } \
  > "$d/model.safetensors"

# Saved at batch 32, resumed at 64.
d=$(case_dir ckpt_batch_mismatch)
checkpoint "{$(meta 32),$step,$bias,$weight}" 68 > "$d/model.safetensors"

# A header length of 2^63-1.
d=$(case_dir ckpt_huge_header)
{ printf '\377\377\377\377\377\377\377\177{}'; } > "$d/model.safetensors"

# The header is not JSON.
d=$(case_dir ckpt_not_json)
checkpoint "not json at all" 0 > "$d/model.safetensors"

# Zero bytes.
d=$(case_dir ckpt_empty)
: > "$d/model.safetensors"
