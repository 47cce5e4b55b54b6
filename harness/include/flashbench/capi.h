/* flashbench's C API: one catalog variant at one config, launched on a caller's stream over the caller's buffers.
 * For harnesses in other processes' languages: scripts/peers.py loads it (ctypes) to time a variant in the same
 * process, with the same timer and interleaved with the torch peers, so that both sides see the same power and
 * thermal state (`--ours`). Each function returns an error status and leaves the reason, one line, in
 * fb_capi_last_error() (per thread). */
#ifndef FLASHBENCH_CAPI_H
#define FLASHBENCH_CAPI_H

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define FB_CAPI __attribute__((visibility("default")))
#else
#define FB_CAPI
#endif

typedef struct fb_capi_launcher fb_capi_launcher;

/* A launcher for VARIANT at CONFIG on PROBLEM_JSON (a plan's problem object: batch, heads_q, heads_kv, seqlen_q,
 * seqlen_kv, head_dim, causal, dtype, layout, scale, pass), on the current CUDA device. A problem with
 * "pass": "bwd" takes a backward variant (e.g. fa2_bwd) and fb_capi_launch_backward; any other, a forward variant
 * and fb_capi_launch.
 *  VARIANT  a catalog name, or "auto": the library's own choice (flashbench/dispatch.hpp: this GPU's tuning table,
 *           else the documented heuristic), the variant and config that flashbench::attention_forward runs.
 *  CONFIG   "block_m=128,block_n=128,..." as in a results file's config_str (axes not named come from the
 *           variant's default for this problem); "" or "default": the variant's default for this problem;
 *           "auto": the tuning table's config for this variant (else its default). With VARIANT "auto" it must be
 *           "", "default" or "auto".
 * fb_capi_variant and fb_capi_choice tell what was chosen and why. Allocates the variant's workspace, its zeroed
 * semaphores and the per-entry KV lengths. NULL where the variant, config or problem is unknown or invalid, the
 * variant does not support it on this device, or an allocation fails. */
FB_CAPI fb_capi_launcher *fb_capi_create(const char *variant, const char *config,
                                         const char *problem_json);
/* What fb_capi_create would choose for the same arguments, without allocating: a JSON object {"variant", "config",
 * "source", "device"} (source: why this config; device: the GPU it was chosen for), valid in this thread until the
 * next fb_capi_choose. Without a CUDA device it plans for a nominal H100 (device says so). NULL on error. */
FB_CAPI const char *fb_capi_choose(const char *variant, const char *config,
                                   const char *problem_json);
/* The launcher's variant (the catalog name, also when it was created as "auto"); "" for NULL. */
FB_CAPI const char *fb_capi_variant(const fb_capi_launcher *l);
/* Why it runs this variant and config: "table nvidia-h200: bucket ...", "heuristic (...): ...", "the default for
 * the problem" or "given ..."; "" for NULL. */
FB_CAPI const char *fb_capi_choice(const fb_capi_launcher *l);
/* The config's canonical string (every axis), owned by the launcher. */
FB_CAPI const char *fb_capi_config_string(const fb_capi_launcher *l);
/* Queues the forward pass on STREAM (a cudaStream_t; NULL for the legacy default stream). Q, K, V and O are in the
 * problem's dtype and layout (O in bf16 for e4m3, whose descales fb_capi_set_descales gives), LSE is fp32
 * [batch, heads_q, seqlen_q]. Asynchronous. 0 on success, -1 on error (a null argument, a backward launcher). */
FB_CAPI int fb_capi_launch(fb_capi_launcher *l, const void *q, const void *k, const void *v,
                           void *o, float *lse, void *stream);
/* Queues the backward pass of a launcher made on a backward problem ("pass": "bwd") on STREAM. Inputs, which it
 * does not write: Q, K, V, O (the forward's output) and DOUT in the problem's dtype, bshd; LSE fp32
 * [batch, heads_q, seqlen_q] (natural log; -inf for a row that sees no key). Outputs, in the problem's dtype,
 * bshd: DQ like Q, DK and DV like K and V (under GQA each sums over its group's query heads). Asynchronous. 0 on
 * success, -1 on error (a null argument, a forward launcher). */
FB_CAPI int fb_capi_launch_backward(fb_capi_launcher *l, const void *q, const void *k,
                                    const void *v, const void *o, const float *lse,
                                    const void *dout, void *dq, void *dk, void *dv, void *stream);
/* e4m3 problems: the float32 descales (device pointers, shapes as in flashbench/variant.hpp's LaunchArgs) that every
 * later fb_capi_launch passes on; O is then bf16. 0 on success, -1 when the launcher is NULL or not e4m3. */
FB_CAPI int fb_capi_set_descales(fb_capi_launcher *l, const float *q_descale,
                                 const float *k_descale, const float *v_descale);
/* Frees the launcher's buffers; the caller synchronises its launches first. NULL is a no-op. */
FB_CAPI void fb_capi_destroy(fb_capi_launcher *l);
/* The last error of this thread, one line; "" if none. */
FB_CAPI const char *fb_capi_last_error(void);
/* This library's build as a JSON object {"source_sha", "options", "toolkit"}: the commit it was built from (as
 * flashbench's results stamp it: "-dirty" with uncommitted changes), its build options and CUDA toolkit, so that a
 * caller's results name the build they timed rather than the caller's checkout. Static storage. */
FB_CAPI const char *fb_capi_build(void);

#ifdef __cplusplus
}
#endif

#endif
