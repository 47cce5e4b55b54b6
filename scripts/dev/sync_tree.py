#!/usr/bin/env python3
"""Copy SRC over DST, touching only files whose bytes changed (and deleting files gone from SRC), so an incremental
build in DST stays incremental. Used to build a committed snapshot (git archive) on the GPU machine while the
working tree there also holds other engineers' uncommitted edits.
    scripts/dev/sync_tree.py SRC DST"""
import filecmp, os, shutil, sys

src, dst = sys.argv[1], sys.argv[2]
changed = 0
for root, dirs, files in os.walk(src):
    rel = os.path.relpath(root, src)
    os.makedirs(os.path.join(dst, rel), exist_ok=True)
    for f in files:
        s, d = os.path.join(root, f), os.path.join(dst, rel, f)
        if not os.path.exists(d) or not filecmp.cmp(s, d, shallow=False):
            shutil.copy2(s, d)
            os.utime(d)  # newer than any object built from the old version
            changed += 1
for root, dirs, files in os.walk(dst):
    rel = os.path.relpath(root, dst)
    if rel.split(os.sep)[0] == "build":
        continue
    for f in files:
        if not os.path.exists(os.path.join(src, rel, f)):
            os.remove(os.path.join(root, f))
print(f"sync_tree: {changed} files updated")
