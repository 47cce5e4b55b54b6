#!/usr/bin/env python3
"""The fa3_pipelined, fa3_fp8 and fa3_bwd kernels' machine code, checked without a GPU.

    scripts/check_sass.py OBJECT...

Disassembles each object with cuobjdump and, for every main kernel in it (fa3_kernel, fa3_fp8_kernel,
fa3_bwd_main), checks:
  - HGMMA (wgmma; QGMMA for fa3_fp8's e4m3) and UTMALDG (TMA loads) are there;
  - no local-memory traffic (STL/LDL: register spills; ptxas also fails the build on a spill);
  - no HGMMA serialisation: when ptxas cannot prove the wgmma pipeline safe it serialises every HGMMA with a
    `WARPGROUP.DEPBAR.LE gsb0, 0x0` (a wait for every wgmma in flight) and prints at most an info line ("(C7512)
    Potential Performance Loss: wgmma.mma_async instructions are serialized"), which the build's
    `-Xptxas --warning-as-error` does not fail on. The forward kernels have
    2 (intra_wg_overlap off) or 3 (on) such waits, so more than 3 fails (53 at d128 when it happened). fa3_bwd's
    main kernel waits once or twice per product of a row block (Sᵀ, dPᵀ, dV, dK, dQ: each several HGMMAs deep), so
    it fails when the waits reach half its HGMMAs (serialised: one per HGMMA).
  - the exponentials of a tile without a mask in one branch-free block: a run of MUFU.EX2 with no BRA between them
    as long as a thread's share of the tile (forward: block_n / 2 scores of a K/V tile; fa3_bwd_main: block_m / 2
    elements of Pᵀ), the tile sizes read from the kernel's template arguments. With the mask test inside fa3_bwd's
    loop ptxas kept a branch every two elements, which cost 10-21% (kernels/fa3_bwd/HISTORY.md); the longest run
    was then 26-50 of 32-64.
The backward's per-row kernels in the same objects (bwd_preprocess, bwd_convert: kernels/common/bwd_rows.cuh) are
plain CUDA: they are checked for spills only. An object without a main kernel fails.
Prints one line per kernel; exit 1 on a failed check, 0 otherwise. Without cuobjdump (on PATH, in
/usr/local/cuda/bin, or from `pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm`) it prints
"check_sass: SKIPPED" and exits 0.
"""
import glob
import os
import re
import shutil
import subprocess
import sys

MAX_FULL_WAITS = 3  # forward kernels (fa3_kernel, fa3_fp8_kernel)
# Kernels that must run on wgmma and TMA; fa3_bwd_main's waits are bounded by its HGMMA count instead.
MAIN_KERNELS = ("fa3_kernel", "fa3_fp8_kernel", "fa3_bwd_main")
# Plain-CUDA kernels compiled into the same objects: no spills, nothing else.
ROW_KERNELS = ("bwd_preprocess", "bwd_convert")


def find_cuobjdump():
    found = shutil.which("cuobjdump")
    if found:
        return found
    if os.access("/usr/local/cuda/bin/cuobjdump", os.X_OK):
        return "/usr/local/cuda/bin/cuobjdump"
    try:
        import nvidia  # the namespace package of NVIDIA's pip wheels
        for root in nvidia.__path__:
            for path in sorted(glob.glob(os.path.join(root, "cu*", "bin", "cuobjdump"))):
                if os.access(path, os.X_OK):
                    return path
    except ImportError:
        pass
    return None


def kernels(sass):
    """{function name: [instruction lines]} of one cuobjdump -sass listing."""
    out, name = {}, None
    for line in sass.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            name = m.group(1)
            out[name] = []
        elif name and re.match(r"\s+/\*[0-9a-f]{4,}\*/", line):
            out[name].append(line)
    return out


def longest_branch_free_run(lines, pattern):
    """The most `pattern` instructions with no BRA between them."""
    best = cur = 0
    for l in lines:
        if re.search(r"\bBRA\b", l):
            best, cur = max(best, cur), 0
        elif re.search(pattern, l):
            cur += 1
    return max(best, cur)


def exps_per_tile(name):
    """A thread's exponentials of one unmasked tile, from the kernel's int template arguments: fa3_kernel<T, D, BN,
    ...> and fa3_fp8_kernel<overlap, q_in_regs, BN, D> take BN / 2 a K/V tile, fa3_bwd_main<T, D, BM> BM / 2 a row
    block. None for a name it does not know."""
    ints = [int(x) for x in re.findall(r"Li(\d+)E", name)]
    if "fa3_bwd_main" in name and ints:
        return ints[-1] // 2
    if "fa3_fp8_kernel" in name and ints:
        return ints[0] // 2
    if "fa3_kernel" in name and len(ints) >= 2:
        return ints[1] // 2
    return None


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    tool = find_cuobjdump()
    if not tool:
        print("check_sass: SKIPPED: no cuobjdump (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
        return 0
    failed, checked = 0, 0
    # CTest passes $<TARGET_OBJECTS:...> as one ;-separated argument.
    objects = [o for arg in argv[1:] for o in arg.split(";") if o]
    for obj in objects:
        # cuobjdump runs nvdisasm for -sass: from its own directory (the pip wheels put both in one).
        env = dict(os.environ, PATH=os.path.dirname(tool) + os.pathsep + os.environ.get("PATH", ""))
        run = subprocess.run([tool, "-sass", obj], capture_output=True, text=True, env=env)
        if run.returncode != 0:
            print(f"check_sass: error: {tool} -sass {obj} failed ({run.stderr.strip()[:200]}); "
                  "install nvdisasm next to it (pip install nvidia-cuda-nvdisasm)")
            return 1
        sass = run.stdout
        found_main = False
        for name, lines in kernels(sass).items():
            main_kernel = any(k in name for k in MAIN_KERNELS)
            if not main_kernel and not any(k in name for k in ROW_KERNELS):
                continue
            checked += 1
            found_main = found_main or main_kernel
            count = lambda pat: sum(1 for l in lines if re.search(pat, l))
            # fp16/bf16 wgmma is HGMMA in SASS, e4m3 (fa3_fp8) is QGMMA
            hgmma, tma = count(r"\b[HQ]GMMA\."), count(r"\bUTMALDG\b")
            local, waits = count(r"\b(STL|LDL)(\.|\s)"), count(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x0")
            bad, exp_note = [], ""
            if local:
                bad.append(f"{local} local-memory instructions (spills)")
            if main_kernel:
                if hgmma == 0:
                    bad.append("no HGMMA/QGMMA")
                if tma == 0:
                    bad.append("no UTMALDG")
                if "fa3_bwd_main" in name:
                    if hgmma and 2 * waits >= hgmma:
                        bad.append(f"{waits} full wgmma waits for {hgmma} HGMMAs (half or more: serialised HGMMAs)")
                elif waits > MAX_FULL_WAITS:
                    bad.append(f"{waits} full wgmma waits (> {MAX_FULL_WAITS}: serialised HGMMAs)")
                need = exps_per_tile(name)
                run = longest_branch_free_run(lines, r"\bMUFU\.EX2\b")
                if need is None:
                    bad.append("tile size not found in the kernel's name (update exps_per_tile)")
                else:
                    exp_note = f", exponentials in one block {run} (a tile {need})"
                    if run < need:
                        bad.append(f"the longest branch-free run of MUFU.EX2 is {run}, under the {need} "
                                   "exponentials of an unmasked tile (a branch inside the loop)")
            failed += bool(bad)
            print(f"{'FAIL' if bad else 'ok  '} {os.path.basename(obj)} {name[:90]}: HGMMA/QGMMA {hgmma}, UTMALDG {tma}, "
                  f"full waits {waits}, STL/LDL {local}{exp_note}{'; ' + '; '.join(bad) if bad else ''}")
        if not found_main:
            failed += 1
            print(f"FAIL {os.path.basename(obj)}: no main kernel ({', '.join(MAIN_KERNELS)})")
    if checked == 0:
        print("check_sass: no fa3 kernel found in " + " ".join(objects))
        return 1
    print(f"check_sass: {checked} kernels, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
