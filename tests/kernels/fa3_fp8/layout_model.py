"""A byte-level model of fa3_fp8's shared-memory layouts at head_dim 64 and 128, without a GPU.

Hardware, modelled from the PTX ISA's definitions (not from the kernel's helpers):
  - the TMA swizzle of a box written to shared memory, and the WGMMA swizzle of the addresses it reads, as
    functions of the absolute byte address: 128B mode XORs address bits [7:9] into [4:6] (Swizzle<3,4,3>), 64B
    mode bits [7:8] into [4:5] (Swizzle<2,4,3>);
  - a K-major WGMMA operand read through a descriptor: start address, SBO and the swizzle mode decoded from the
    packed 64-bit descriptor; row r of the operand at start + (r / 8) * SBO + (r % 8) * (the mode's row bytes);
  - ldmatrix.x4 (with and without .trans), stmatrix.x4 and PRMT (__byte_perm) on 16-bit elements.
Kernel, mirrored from kernels/common/hopper/{tma,wgmma}.cuh and kernels/fa3_fp8/fa3_fp8.cu (keep them in step):
swizzle_128b, swizzle_64b, make_desc / desc_base / desc_base_64b, q_desc, TransposeLanes and transpose_v,
load_q_regs, issue_qk's and issue_pv's k-step offsets.

Checks, for HD 64 and HD 128 (the latter the layout verified on GPUs, so a check of the model itself):
  1. the kernel's swizzle helpers equal the TMA placement;
  2. Q K^T: every k-step's A (each warpgroup's 64 Q rows) and B (the 128 K rows) read through the kernel's
     descriptors are the intended 32 bytes of head_dim;
  3. q_in_regs: load_q_regs gives every lane the RS A fragment of each k-step;
  4. V^T: the producer's 128 threads write every V^T byte exactly once, and P V's B operand (N = head_dim rows,
     K = 32 keys a k-step, read through the kernel's descriptor) at position p of k-step kt holds
     V[32 kt + key(p)][n], key(p) = 16 (p / 16) + 8 ((p % 4) >> 1) + 2 ((p % 16) / 4) + (p % 2): the order in which
     the S accumulator leaves P as A fragments (rescale_and_pack);
  5. every ldmatrix / stmatrix phase of the transposers and of load_q_regs touches 8 different 16-byte bank groups.

    python3 tests/kernels/fa3_fp8/layout_model.py      (exit status 0 when every check passes)
"""
import random
import sys

MASK64 = (1 << 64) - 1


# ---- hardware (PTX ISA)
def hw_swizzle(addr, mode):
    """The absolute shared-memory address a swizzled access lands on (mode: 1 = 128B, 2 = 64B)."""
    if mode == 1:
        return addr ^ (((addr >> 7) & 7) << 4)
    if mode == 2:
        return addr ^ (((addr >> 7) & 3) << 4)
    raise ValueError(mode)


MODE_ROW_BYTES = {1: 128, 2: 64}


def tma_write(mem, base, tile, row_bytes, mode):
    """A TMA box of len(tile) rows x row_bytes into shared memory at base under the swizzle mode (mem: a dict of
    bytes; a byte never written reads as -1)."""
    assert row_bytes == MODE_ROW_BYTES[mode]
    for r, row in enumerate(tile):
        for col in range(row_bytes):
            mem[hw_swizzle(base + r * row_bytes + col, mode)] = row[col]


def decode_desc(desc):
    start = (desc & 0x3FFF) << 4
    lbo = ((desc >> 16) & 0x3FFF) << 4
    sbo = ((desc >> 32) & 0x3FFF) << 4
    base_offset = (desc >> 49) & 7
    mode = (desc >> 62) & 3
    return start, lbo, sbo, base_offset, mode


def wgmma_kmajor(mem, desc, rows, kbytes=32):
    """The K-major operand (rows x kbytes) one k32 e4m3 WGMMA reads through desc."""
    start, _, sbo, base_offset, mode = decode_desc(desc)
    assert base_offset == 0
    pitch = MODE_ROW_BYTES[mode]
    return [[mem.get(hw_swizzle(start + (r // 8) * sbo + (r % 8) * pitch + k, mode), -1) for k in range(kbytes)]
            for r in range(rows)]


def ldmatrix_x4(mem, addrs, trans):
    """addrs[lane]: the row address lane gives (matrix lane / 8, row lane % 8). Returns regs[lane][j] as 4 bytes."""
    mats = [[[mem.get(addrs[8 * j + r] + b, -1) for b in range(16)] for r in range(8)] for j in range(4)]
    regs = []
    for t in range(32):
        g, c = t // 4, t % 4
        out = []
        for j in range(4):
            m = mats[j]
            if trans:  # 16-bit element (row 2c, col g) then (row 2c + 1, col g)
                out.append([m[2 * c][2 * g], m[2 * c][2 * g + 1], m[2 * c + 1][2 * g], m[2 * c + 1][2 * g + 1]])
            else:  # row g, 16-bit elements 2c and 2c + 1
                out.append(m[g][4 * c:4 * c + 4])
        regs.append(out)
    return regs


def stmatrix_x4(mem, addrs, regs, written):
    """regs[lane][j]: lane's 4 bytes of matrix j (row lane / 4, bytes 4 (lane % 4)..); addrs as ldmatrix."""
    for j in range(4):
        for r in range(8):
            a = addrs[8 * j + r]
            for c in range(4):
                for b in range(4):
                    mem[a + 4 * c + b] = regs[4 * r + c][j][b]
                    written[a + 4 * c + b] = written.get(a + 4 * c + b, 0) + 1


def byte_perm(x, y, sel):
    src = x + y
    return [src[(sel >> (4 * n)) & 7] for n in range(4)]


def conflict_free(addrs):
    """Each 8-lane phase of an x4 ldmatrix/stmatrix: 8 rows of 16 bytes in 8 different 16-byte bank groups."""
    return all(len({(addrs[8 * j + r] >> 4) & 7 for r in range(8)}) == 8 for j in range(4))


# ---- kernel twins
def swizzle_128b(row, byte):
    return row * 128 + ((((byte >> 4) ^ row) & 7) << 4) + (byte & 15)


def swizzle_64b(row, byte):
    return row * 64 + ((((byte >> 4) ^ (row >> 1)) & 3) << 4) + (byte & 15)


def make_desc(smem, lbo, sbo, mode=1):
    d = ((smem & 0x3FFFF) >> 4) | (((lbo & 0x3FFFF) >> 4) << 16) | (((sbo & 0x3FFFF) >> 4) << 32)
    return (d | ((mode & 3) << 62)) & MASK64


class DescBase:
    def __init__(self, d):
        self.lo, self.hi = d & 0xFFFFFFFF, d >> 32

    def at(self, byte_off):
        return (self.hi << 32) | ((self.lo + (byte_off >> 4)) & 0xFFFFFFFF)


def desc_base(smem, lbo):
    return DescBase(make_desc(smem, lbo, 1024))


def desc_base_64b(smem):
    return DescBase(make_desc(smem, 16, 512, 2))


def row_bytes(hd):  # kRowBytes<HD>
    return hd if hd < 128 else 128


def q_desc(hd, q_tile, wg):
    return desc_base_64b(q_tile + wg * 64 * 64) if hd == 64 else desc_base(q_tile + wg * 64 * 128, 16)


def k_desc(hd, k_tile):  # issue_qk
    return desc_base_64b(k_tile) if hd == 64 else desc_base(k_tile, 16)


class TransposeLanes:  # BN 128 (G = 2)
    G = 2

    def __init__(self, u, hd):
        w, t = u >> 5, u & 31
        m, i = t >> 3, t & 7
        sw = swizzle_64b if hd == 64 else swizzle_128b
        self.ld = sw(16 * (self.G * w) + 8 * (m & 1) + i, 16 * (m >> 1))
        row = 16 * (m >> 1) + 2 * i + ((m & 1) ^ (i >> 2))
        self.st0 = swizzle_128b(row, 16 * (self.G * w))
        hi = t >= 16
        self.sel_a = 0x7531 if hi else 0x6420
        self.sel_b = 0x6420 if hi else 0x7531

    def load(self, dg):
        return self.ld ^ (dg << 5)

    def store(self, k):
        return self.st0 ^ (k << 4)


def key_of(p):
    b, c = p % 4, (p % 16) // 4
    return 16 * (p // 16) + 8 * (b >> 1) + 2 * c + (b & 1)


# ---- checks
def check(hd, rng, fails):
    rb = row_bytes(hd)
    mode = 2 if hd == 64 else 1
    name = f"HD {hd}"

    # 1. helpers against the TMA placement
    sw = swizzle_64b if hd == 64 else swizzle_128b
    for r in range(128):
        for col in range(rb):
            if sw(r, col) != hw_swizzle(r * rb + col, mode):
                fails.append(f"{name}: swizzle helper differs from the TMA at row {r} byte {col}")
                return

    # 2. Q K^T operands (one column half at HD 128: the whole tile)
    q = [[rng.randrange(256) for _ in range(rb)] for _ in range(128)]
    k = [[rng.randrange(256) for _ in range(rb)] for _ in range(128)]
    mem = {}
    q_base, k_base = 0x2000, 0x8000  # 1024-aligned, as Smem's tiles
    tma_write(mem, q_base, q, rb, mode)
    tma_write(mem, k_base, k, rb, mode)
    for kk in range(rb // 32):
        bk = wgmma_kmajor(mem, k_desc(hd, k_base).at(kk * 32), 128)
        if bk != [row[32 * kk:32 * kk + 32] for row in k]:
            fails.append(f"{name}: K operand of k-step {kk}")
        for wg in range(2):
            aq = wgmma_kmajor(mem, q_desc(hd, q_base, wg).at(kk * 32), 64)
            if aq != [row[32 * kk:32 * kk + 32] for row in q[64 * wg:64 * wg + 64]]:
                fails.append(f"{name}: Q operand of warpgroup {wg}, k-step {kk}")

    # 3. load_q_regs
    for wg in range(2):
        for warp in range(4):
            for kk in range(rb // 32):
                addrs = []
                for lane in range(32):
                    m = lane >> 3
                    row = 64 * wg + 16 * warp + 8 * (m & 1) + (lane & 7)
                    addrs.append(q_base + sw(row, 32 * kk + 16 * (m >> 1)))
                if not conflict_free(addrs):
                    fails.append(f"{name}: load_q_regs bank conflict (wg {wg} warp {warp} k-step {kk})")
                regs = ldmatrix_x4(mem, addrs, trans=False)
                r0 = 64 * wg + 16 * warp
                for lane in range(32):
                    g, c = lane // 4, lane % 4
                    want = [q[r0 + g][32 * kk + 4 * c:32 * kk + 4 * c + 4],
                            q[r0 + g + 8][32 * kk + 4 * c:32 * kk + 4 * c + 4],
                            q[r0 + g][32 * kk + 16 + 4 * c:32 * kk + 20 + 4 * c],
                            q[r0 + g + 8][32 * kk + 16 + 4 * c:32 * kk + 20 + 4 * c]]
                    if regs[lane] != want:
                        fails.append(f"{name}: load_q_regs fragment (wg {wg} warp {warp} lane {lane} k-step {kk})")
                        break

    # 4. V -> V^T (one column half at HD 128), then P V's B operand
    v = [[rng.randrange(256) for _ in range(rb)] for _ in range(128)]
    vraw, vt = 0x10000, 0x14000
    tma_write(mem, vraw, v, rb, mode)
    written = {}
    for w in range(4):
        lanes = [TransposeLanes(32 * w + t, hd) for t in range(32)]
        for kg in range(TransposeLanes.G):
            for dg in range(rb // 32):
                la = [vraw + ln.load(dg) + 16 * rb * kg for ln in lanes]
                if not conflict_free(la):
                    fails.append(f"{name}: transposer load bank conflict (warp {w} key group {kg} dg {dg})")
                r = ldmatrix_x4(mem, la, trans=True)
                out = []
                for t, ln in enumerate(lanes):
                    x = r[t]
                    out.append([byte_perm(x[0], x[1], ln.sel_a), byte_perm(x[0], x[1], ln.sel_b),
                                byte_perm(x[2], x[3], ln.sel_a), byte_perm(x[2], x[3], ln.sel_b)])
                sa = [vt + ln.store(kg) + 4096 * dg for ln in lanes]
                if not conflict_free(sa):
                    fails.append(f"{name}: transposer store bank conflict (warp {w} key group {kg} dg {dg})")
                stmatrix_x4(mem, sa, out, written)
    vt_bytes = rb * 128  # vt_tile_bytes(128, HD) for one head_dim half
    if sorted(written) != list(range(vt, vt + vt_bytes)) or any(n != 1 for n in written.values()):
        fails.append(f"{name}: V^T not written exactly once over its {vt_bytes} bytes")
    dv = desc_base(vt, 16)
    for kt in range(4):
        bv = wgmma_kmajor(mem, dv.at(kt * 32), rb)  # N = head_dim rows (64 at HD 64)
        for n in range(rb):
            for p in range(32):
                if bv[n][p] != v[32 * kt + key_of(p)][n]:
                    fails.append(f"{name}: P V's B at k-step {kt}, head_dim {n}, position {p}")
                    break
            else:
                continue
            break

    # P's A fragment order (rescale_and_pack) against key_of: the S accumulator holds key 8 i + 2 c + (e & 1) at
    # sacc[4 i + e]; pa[kt][0..3] pack sacc[16 kt + {0, 1, 4, 5}], {2, 3, 6, 7}, {8, 9, 12, 13}, {10, 11, 14, 15}.
    pack = [[0, 1, 4, 5], [2, 3, 6, 7], [8, 9, 12, 13], [10, 11, 14, 15]]
    for c in range(4):
        for reg, idx in enumerate(pack):
            for j, s in enumerate(idx):
                i, e = s // 4, s % 4
                key = 8 * i + 2 * c + (e & 1)
                if e >> 1:  # row half 1: the same keys, register a1 / a3
                    continue
                p = 16 * (reg >> 1) + 4 * c + j
                if key_of(p) != key:
                    fails.append(f"P fragment position {p} holds key {key}, V^T has {key_of(p)}")


def main():
    rng = random.Random(1)
    fails = []
    for hd in (128, 64):
        check(hd, rng, fails)
    for f in fails[:20]:
        print("FAIL", f)
    print(f"{len(fails)} failures" if fails else "layout model: all checks pass (HD 128, HD 64)")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
