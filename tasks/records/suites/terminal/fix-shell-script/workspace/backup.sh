#!/bin/bash
# Copy every .txt file from the folder given as $1 into the folder given as $2, adding the
# suffix .bak to each copy, then print how many files were copied.
src=$1
dst=$2
mkdir -p $dst
count=0
for f in $(ls $src/*.txt); do
  cp $f $dst/$(basename $f).bak
  count=$((count + 1)
done
echo "copied $cout files"
