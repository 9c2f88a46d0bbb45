// kernels.h: the backend contract. The orchestration (train_gpt.cu and its modules) calls only these
// functions; the CPU build links kernels/*.c + backend_cpu.c, the CUDA build links backend_cuda.cu
// (which includes kernels/*.cuh). Same names, same semantics, chosen at link time.
//
// Conventions (both backends):
// - Pointers are backend memory (device memory on the GPU; plain host memory on the CPU), except where
//   a parameter is documented as host memory.
// - "X" tensors have the run's storage type `dt` (fp32, bf16 or fp16); other tensors are fp32 (float*)
//   or int32 (int*). Arithmetic is fp32; a value is rounded to `dt` (round-to-nearest-even) when it is
//   stored. The CPU backend stores bf16/fp16 as real 16-bit values, so its buffers have the GPU's layout.
// - Parameter gradients ACCUMULATE (+=), so gradient accumulation needs no extra buffers. Activation
//   gradients are OVERWRITTEN, except layernorm_backward's and rmsnorm_backward's dinp, which accumulate
//   (it is the residual).
// - Kernels are asynchronous on the backend's main stream; be_download and be_synchronize wait.
// - Shapes are in comments as (B,T,C); N = B*T rows.
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { DT_FP32 = 0, DT_BF16 = 1, DT_FP16 = 2 } DType;

static inline size_t dtype_size(DType dt) { return dt == DT_FP32 ? 4 : 2; }
static inline const char* dtype_name(DType dt) { return dt == DT_FP32 ? "fp32" : dt == DT_BF16 ? "bf16" : "fp16"; }

// ---------------------------------------------------------------------------------------------------
// Backend: device selection, memory, synchronization. Opaque; one per rank.
typedef struct Backend Backend;

Backend* backend_create(int local_rank);   // GPU: device local_rank % device count
void backend_destroy(Backend* be);
const char* backend_device_name(const Backend* be);   // "cpu" or e.g. "NVIDIA H100 80GB HBM3"
int backend_is_gpu(const Backend* be);
int backend_build_is_gpu(void);   // the same, known before any backend exists (this binary's build)
// The opt-in kernel variants this backend runs (base/gpu_variants.h: GPT_CUDA_VARIANTS, read at backend_create).
unsigned backend_variants(const Backend* be);
// The main stream as a cudaStream_t (GPU; NULL on the CPU), for libraries that enqueue work in order with
// the kernels (NCCL, core/comm/comm_nccl.c).
void* backend_stream(Backend* be);
// The communication stream (GPU; NULL on the CPU): every NCCL collective of this rank, of every group, runs
// on it in the order the program issued them, so collectives overlap the kernels but never each other (NCCL
// kernels of two streams running at once can deadlock). The comm layer orders it against the main stream
// with events of its own (core/comm/comm_nccl.c); nothing else enqueues on it.
void* backend_comm_stream(Backend* be);

void* be_malloc(Backend* be, size_t bytes);            // fails (one-line error, exit 1) when out of memory
void be_free(Backend* be, void* p);
void be_memset0(Backend* be, void* p, size_t bytes);
void be_upload(Backend* be, void* dst, const void* src_host, size_t bytes);
void be_download(Backend* be, void* dst_host, const void* src, size_t bytes);   // synchronous
void be_copy(Backend* be, void* dst, const void* src, size_t bytes);
// `rows` rows of `row_bytes` each, from src to dst, each side's rows `pitch` bytes apart (a block of columns
// of one matrix into another's); the two may not overlap.
void be_copy_rows(Backend* be, void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t row_bytes, size_t rows);
void be_synchronize(Backend* be);                      // every stream, copies included
size_t be_peak_bytes(const Backend* be);               // high-water mark of be_malloc'd bytes
// Host memory the host computes on and the backend copies to and from (optimizer state kept on the host,
// -offload): page-locked on the GPU (cudaMallocHost), so be_upload/be_download move it by DMA at full speed;
// plain malloc on the CPU. Fails like be_malloc; not counted by be_peak_bytes. Free only with be_host_free.
void* be_host_alloc(Backend* be, size_t bytes);
void be_host_free(Backend* be, void* p);

// Asynchronous copies between backend memory and be_host_alloc'd memory (-offload's transfers). On the GPU
// they run on two copy streams, one per direction, each in the order issued; every copy runs after all the
// main stream's work enqueued before it and concurrently with what is enqueued after. They are NOT ordered
// after the comm stream: memory a collective writes needs its comm_wait before a copy of it is issued. `done`
// marks the copy's completion; until then neither buffer may be touched: the host waits with
// be_event_synchronize (from any thread), the main stream with be_stream_wait. An event marks the last copy
// issued with it. The CPU backend runs each copy as late as it may (when its event or a later one is waited
// for, and at be_synchronize, be_free and be_host_free; one queue per direction, so waiting for an upload
// runs no download), and fills the destination with 0xff bytes when the copy is issued (a copy engine may
// write it any time from then), so a missing wait reads NaNs on the CPU build too, where the tests see it.
typedef struct BeEvent BeEvent;
BeEvent* be_event_create(Backend* be);
void be_event_destroy(Backend* be, BeEvent* ev);
void be_download_async(Backend* be, void* dst_host, const void* src, size_t bytes, BeEvent* done);
void be_upload_async(Backend* be, void* dst, const void* src_host, size_t bytes, BeEvent* done);
void be_stream_wait(Backend* be, BeEvent* ev);         // main-stream work issued later runs after ev's copy
void be_event_synchronize(Backend* be, BeEvent* ev);   // the host waits for ev's copy (and those before it, its direction)

// ---------------------------------------------------------------------------------------------------
// Precision helpers (host side; the same rounding the kernels use when they store).
float dtype_round(float x, DType dt);                  // round-to-nearest-even to dt, returned as float
void host_to_dtype(void* dst, DType dt, const float* src, size_t n);   // host memory both sides
void host_from_dtype(float* dst, const void* src, DType dt, size_t n);

// Convert n elements between storage types (backend memory). Round-to-nearest-even.
void convert(Backend* be, void* dst, DType dst_dt, const void* src, DType src_dt, size_t n);

// ---------------------------------------------------------------------------------------------------
// Layers.

// Documents. Two optional per-token int arrays (B,T) in backend memory describe the documents packed into each
// row; NULL means each row is one document starting at 0, and then the kernels compute what they computed
// before documents existed, bit for bit:
// - pos: the token's position in its document (the learned position row wpe[pos]; RoPE's angle (float)pos), or
//   in its sequence when a row holds later parts of one (context parallelism: positions p0 .. p0 + T - 1, or
//   under -cpm ring two runs, p0 .. p0 + T/2 - 1 then p1 .. p1 + T/2 - 1 with p1 > p0 + T/2 - 1, or with
//   documents each half of the row its documents' positions; the caller keeps them below the position table's
//   rows);
// - doc: the row index of the first token of the token's document. Query t attends keys j with
//   doc[t] <= j <= t (block-diagonal causal). Documents are contiguous: doc is non-decreasing within a row,
//   doc[t] <= t, and doc[t] == doc[t'] for every t' in [doc[t], t]; then pos[t] = t - doc[t] in [0, t]. pos
//   without doc is each row one document, positions from its first token's.
// The argument goes right after the token or qkv input it qualifies. The CPU twins check the arrays (a malformed
// one is a one-line error); the CUDA kernels read them as given.

// out (B,T,C) X = wte[tokens[b,t]] (Vp,C) X + wpe[p] (maxT,C) X, p = pos ? pos[b,t] : t.   tokens (B,T) int
void encoder_forward(Backend* be, DType dt, void* out, const int* tokens, const int* pos, const void* wte,
                     const void* wpe, int B, int T, int C);
// dwte += scatter of dout by token; dwpe[p] += the sum of dout over the tokens at position p (p as in the
// forward), added in increasing (b,t) order (with pos NULL: dwpe[t] += sum_b dout[b,t]). Deterministic: every
// run gives the same bits.
void encoder_backward(Backend* be, DType dt, void* dwte, void* dwpe, const void* dout, const int* tokens,
                      const int* pos, int B, int T, int C);

// The vocabulary-parallel embedding (-tp N): this rank holds wte rows [v0, v0 + Vl) as wte (Vl,C).
// out (B,T,C) X = (v0 <= tok < v0 + Vl ? wte[tok - v0] : 0) + (wpe ? wpe[p] : 0), tok = tokens[b,t], p as in
// encoder_forward; the tensor group's sum of every rank's out is encoder_forward's (one rank passes wpe, the
// others NULL).
void encoder_forward_vocab(Backend* be, DType dt, void* out, const int* tokens, const int* pos, const void* wte,
                           const void* wpe, int v0, int Vl, int B, int T, int C);
// dwte (Vl,C) += scatter of the rows of dout whose token is in [v0, v0 + Vl); dwpe as encoder_backward, or
// NULL (a model without position embeddings). Deterministic like encoder_backward.
void encoder_backward_vocab(Backend* be, DType dt, void* dwte, void* dwpe, const void* dout, const int* tokens,
                            const int* pos, int v0, int Vl, int B, int T, int C);

// out (N,C) X = (inp - mean) * rstd * w + b; mean, rstd (N) fp32 are saved for the backward. eps = 1e-5.
void layernorm_forward(Backend* be, DType dt, void* out, float* mean, float* rstd, const void* inp,
                       const void* w, const void* b, int N, int C);
// dinp (N,C) +=, dw (C) +=, db (C) +=.
void layernorm_backward(Backend* be, DType dt, void* dinp, void* dw, void* db, const void* dout,
                        const void* inp, const void* w, const float* mean, const float* rstd, int N, int C);

// RMSNorm (Llama's, fp32 statistics): out (N,C) X = inp * rstd * w, rstd (N) fp32 = 1/sqrt(mean(inp^2) + eps),
// saved for the backward.
void rmsnorm_forward(Backend* be, DType dt, void* out, float* rstd, const void* inp, const void* w, int N, int C, float eps);
// dinp (N,C) += (it is the residual, like layernorm_backward), dw (C) +=. Deterministic.
void rmsnorm_backward(Backend* be, DType dt, void* dinp, void* dw, const void* dout, const void* inp, const void* w,
                      const float* rstd, int N, int C);

// Per-head RMSNorm of q and k inside packed qkv (Qwen3's q_norm/k_norm): qkv (N, (NH+2KV)*D) X packs per row
// [q: NH heads of D | k: KV heads of D | v: KV heads of D]. out has the same layout: every q head normalized
// over its D channels with weight qw (D), every k head with kw (D), v copied. rstd (N, NH+KV) fp32. out != inp.
void qk_norm_forward(Backend* be, DType dt, void* out, float* rstd, const void* inp, const void* qw, const void* kw,
                     int N, int NH, int KV, int D, float eps);
// dinp (N,(NH+2KV)*D) X OVERWRITTEN (its v part = dout's v part); dqw, dkw (D) +=. Deterministic.
void qk_norm_backward(Backend* be, DType dt, void* dinp, void* dqw, void* dkw, const void* dout, const void* inp,
                      const void* qw, const void* kw, const float* rstd, int N, int NH, int KV, int D);

// Rotary position embedding, rotate-half convention (Hugging Face's apply_rotary_pos_emb), on the q and k heads of
// packed qkv (B,T,(NH+2KV)*D) X, v copied: for position t (pos[b,t] when pos is not NULL) and channel i < D/2
// of a head, a = t * inv_freq[i],
// x1 = x[i], x2 = x[i + D/2]: out[i] = x1 cos a - x2 sin a, out[i + D/2] = x2 cos a + x1 sin a. inv_freq (D/2) fp32
// in backend memory (the model computes it from rope_theta and its scaling). out may alias inp. D even.
// a is one fp32 product, (float)t * inv_freq[i], as Hugging Face forms it; cos and sin are fp32.
void rope_forward(Backend* be, DType dt, void* out, const void* inp, const float* inv_freq, const int* pos, int B, int T,
                  int NH, int KV, int D);
// The transpose (rotation by -a): dinp from dout, same layout; may alias.
void rope_backward(Backend* be, DType dt, void* dinp, const void* dout, const float* inv_freq, const int* pos, int B,
                   int T, int NH, int KV, int D);

// SwiGLU: out (N,F) X = silu(gate) * up, silu(x) = x / (1 + exp(-x)), from gu (N,2F) X packing per row [gate (F) | up (F)]
// (one matmul makes both).
void swiglu_forward(Backend* be, DType dt, void* out, const void* gu, int N, int F);
// dgu (N,2F) X overwritten from dout (N,F).
void swiglu_backward(Backend* be, DType dt, void* dgu, const void* dout, const void* gu, int N, int F);

// out (N,OC) = inp (N,IC) @ w^T + bias, with w (OC,IC) row-major and bias (OC) or NULL.
// If out_pre_gelu != NULL: out_pre_gelu = that product, out = gelu(out_pre_gelu)  (fused GELU epilogue).
void matmul_forward(Backend* be, DType dt, void* out, void* out_pre_gelu, const void* inp, const void* w,
                    const void* bias, int N, int IC, int OC);
// dinp (N,IC) = dout @ w (overwritten); dw (OC,IC) += dout^T @ inp; dbias (OC) += column sums of dout
// (dbias may be NULL). If inp_pre_gelu != NULL then inp = gelu(inp_pre_gelu) and dinp is the gradient
// with respect to inp_pre_gelu (fused GELU backward): dinp = (dout @ w) * gelu'(inp_pre_gelu).
void matmul_backward(Backend* be, DType dt, void* dinp, void* dw, void* dbias, const void* dout,
                     const void* inp, const void* inp_pre_gelu, const void* w, int N, int IC, int OC);
// The two halves of matmul_backward, for schedules that run them apart (zero-bubble pipelines: the input
// gradient goes upstream at once, the weight gradient waits). Each gives the bits matmul_backward gives.
void matmul_backward_input(Backend* be, DType dt, void* dinp, const void* dout, const void* inp_pre_gelu, const void* w,
                           int N, int IC, int OC);
void matmul_backward_weight(Backend* be, DType dt, void* dw, void* dbias, const void* dout, const void* inp, int N, int IC,
                            int OC);

// Causal self-attention with grouped-query heads. qkv (B,T,(NH+2KV)*D) X packs per row [q: NH heads of D |
// k: KV heads | v: KV heads]; query head h attends with kv head h / (NH/KV) (KV divides NH; KV == NH is
// multi-head attention, KV == 1 multi-query). out (B,T,NH*D) X. lse (B,NH,T) fp32 = log-sum-exp of the scaled
// scores q.k/sqrt(D) over the causal row: all the backward needs (no (T,T) matrix is kept). With doc (see
// Documents above) the row is keys doc[b,t] .. t: each document attends only to itself, and the work of the
// masked keys is skipped, not computed and discarded. The CUDA backend takes D a multiple of 8, at most 128.
void attention_forward(Backend* be, DType dt, void* out, float* lse, const void* qkv, const int* doc, int B, int T,
                       int NH, int KV, int D);
// dqkv (B,T,(NH+2KV)*D) X overwritten (a kv head's gradient sums over the query heads sharing it, in a fixed
// order: deterministic). scratch: B*NH*T floats the kernel may use.
void attention_backward(Backend* be, DType dt, void* dqkv, float* scratch, const void* dout, const void* qkv,
                        const void* out, const float* lse, const int* doc, int B, int T, int NH, int KV, int D);

// Attention in chunks (ring attention's pieces): a query chunk against one key/value chunk at a time, with the
// chunks' global positions, merged by log-sum-exp; the sequence's attention is the merge over every chunk.
// q (B,Tq,NH*D) X: queries at global positions q0 .. q0+Tq-1. kv (B,Tk,2*KV*D) X packs per row [k: KV heads of D |
// v: KV heads]: keys at k0 .. k0+Tk-1. Causal on the global positions: query t attends key s iff k0+s <= q0+t;
// heads grouped as attention_forward's. doc (B,Tq) int or NULL (Documents above, in the sequence's positions): the
// first position of each query's document; query t then attends key s iff doc[b,t] <= k0+s <= q0+t, so only the
// queries' documents are needed (documents are contiguous). out (B,Tq,NH*D) X, normalised over this chunk's keys;
// lse (B,NH,Tq) fp32, natural log of the sum of exp(q.k/sqrt(D)) over them. A query row with no key here (the
// chunk lies in its future, or before its document) gets lse = -inf and out = 0. The CUDA backend takes D a
// multiple of 8, at most 128.
void attention_chunk_forward(Backend* be, DType dt, void* out, float* lse, const void* q, const void* kv, const int* doc,
                             int B, int Tq, int Tk, int q0, int k0, int NH, int KV, int D);
// (out, lse) <- the attention over both key sets of (out, lse) and (out2, lse2), all (B,T,NH*D) X and (B,NH,T)
// fp32: m = max(lse, lse2), w = exp(lse - m), w2 = exp(lse2 - m), out = (w out + w2 out2) / (w + w2),
// lse = m + log(w + w2). lse = lse2 = -inf gives lse = -inf and out = 0; a side at -inf leaves the other's bits.
void attention_lse_merge(Backend* be, DType dt, void* out, float* lse, const void* out2, const float* lse2, int B, int T,
                         int NH, int D);
// The chunk pair's gradients, ACCUMULATED: dq (B,Tq,NH*D) X += its share from this key chunk, dkv (B,Tk,2*KV*D) X
// += this query chunk's share of dk and dv. out and lse are the query rows' FINAL ones (merged over every key
// chunk), dout (B,Tq,NH*D) X their gradient; doc as the forward's. Summed over every chunk pair, dq, dk and dv are
// attention_backward's. A query row with no key here adds nothing. Each output row is summed in a fixed order
// (deterministic).
void attention_chunk_backward(Backend* be, DType dt, void* dq, void* dkv, const void* dout, const void* q,
                              const void* kv, const void* out, const float* lse, const int* doc, int B, int Tq, int Tk,
                              int q0, int k0, int NH, int KV, int D);

// out = a + b (n elements). out may alias a or b.
void residual_forward(Backend* be, DType dt, void* out, const void* a, const void* b, size_t n);
// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
void gelu_forward(Backend* be, DType dt, void* out, const void* inp, size_t n);
// dinp = dout * gelu'(inp). dinp may alias dout.
void gelu_backward(Backend* be, DType dt, void* dinp, const void* inp, const void* dout, size_t n);

// LoRA's dropout (core/model/lora.h): out (N,C) X = inp * (1 / (1 - p)) where the mask keeps an element, 0
// where it drops it. The C columns are columns [col0, col0 + C) of a matrix with rows of `width` (col0 0 and
// width C for a whole matrix): element (n, c) is the matrix's n * width + col0 + c, kept when
// dropout_keeps(key, that index, p) (kernels/dtype.h), so a shard of columns draws the whole matrix's mask. The forward's and the backward's
// (the mask and scale on the input gradient) are the same call. out may alias inp. 0 <= p < 1.
void lora_dropout(Backend* be, DType dt, void* out, const void* inp, int N, int C, int col0, int width, uint32_t key,
                  float p);

// Block quantization (ZeRO++'s quantized weight gathers and gradient reductions): x's n elements X in blocks of
// `block` (the last may be shorter; even for 4 bits, so no byte holds two blocks), each stored as `bits`-bit
// signed integers q (8: one int8 per element; 4: two per byte, the even element in the low nibble, a lone last
// element's high nibble 0) with one fp32 scale per block: scale = absmax / qmax (qmax = 2^(bits-1) - 1),
// q = rint(x / scale) (0 where scale is 0), so |x - q scale| <= scale / 2 = absmax / (2 qmax). A block holding
// a NaN or an infinity gets scale NaN and q 0: its dequantized values are NaN, so an overflow is never
// quantized away. The bits of q and scales do not depend on the backend.
size_t quantized_bytes(size_t n, int bits);            // q's size
size_t quantized_blocks(size_t n, int block);          // scales' count
void quantize_blocks(Backend* be, DType dt, void* q, float* scales, const void* x, size_t n, int block, int bits);
// out (n) X = q scale, rounded to dt; with `add`, out += q scale (one rounding). out may not overlap q.
void dequantize_blocks(Backend* be, DType dt, void* out, const void* q, const float* scales, size_t n, int block,
                       int bits, int add);

#define CLASSIFIER_IGNORE (-1)   // a target that is not a label (classifier_forward)

// Fused LM-head loss over logits (N,Vp) X whose first V columns are real:
// losses[n] (fp32) = logsumexp(logits[n,:V]) - logits[n, targets[n]].
// If write_dlogits: logits[n,v] is overwritten by dloss * (softmax[n,v] - [v == targets[n]]) for v < V
// and 0 for V <= v < Vp. No probabilities are materialized. targets[n] == -1 marks a row that is not a label
// (a prompt token, padding, a document's last token): its loss is 0 and its dlogits row all zeros.
void classifier_forward(Backend* be, DType dt, void* logits, float* losses, const int* targets, int N, int V, int Vp,
                        float dloss, int write_dlogits);

// The vocabulary-parallel cross-entropy (-tp N) over this rank's logits (N,Vl) X: columns [v0, v0 + Vl) of
// the vocabulary, of which the first `real` = clamp(V - v0, 0, Vl) are real. Three steps, each followed by
// a max or an all-gather over the tensor group, so no rank ever holds a whole row. A target of -1 is ignored as
// in classifier_forward (loss 0, a zero dlogits row):
// 1. rowmax (N) fp32 = the max of the row's real logits here (-inf when real == 0); then the group's max.
void classifier_vocab_max(Backend* be, DType dt, float* rowmax, const void* logits, int N, int real, int Vl);
// 2. stats (3, N) fp32: the sum of exp(logit - rowmax[n]) over the row's real columns here as two floats,
//    stats[n] + stats[N + n] (hi and lo: the normalizer keeps double precision across ranks, so the loss
//    has the one-rank kernel's bits wherever the double sums round alike); stats[2N + n] = the target's
//    logit when v0 <= targets[n] < v0 + real, else 0. Then the group all-gathers every rank's stats.
void classifier_vocab_sums(Backend* be, DType dt, float* stats, const void* logits, const float* rowmax,
                           const int* targets, int v0, int N, int real, int Vl);
// 3. all (ranks, 3, N): every rank's step-2 stats. losses[n] = rowmax[n] + log(S) - the target's logit, S the
//    sum over ranks of hi + lo (in double, rank order); if write_dlogits, the logits are overwritten as
//    classifier_forward's are: dloss * (softmax - [column == target]) on real columns, 0 on the rest.
void classifier_vocab_finish(Backend* be, DType dt, void* logits, float* losses, const float* rowmax,
                             const float* all, int ranks, const int* targets, int v0, int N, int real, int Vl,
                             float dloss, int write_dlogits);

// ---------------------------------------------------------------------------------------------------
// Optimizer and norms.

typedef struct {
    float lr, beta1, beta2, eps, weight_decay;
    float grad_scale;   // gradients are multiplied by this before use (clipping, loss-scale, 1/accumulation)
    int step;           // 1-based, for bias correction
    uint32_t seed;      // stochastic rounding of bf16 params: the noise is a function of (seed, offset + i)
} AdamWArgs;

// One contiguous span of n parameters. master, m, v fp32 (n). grads (n) of grad_dt.
// master -= lr * (mhat / (sqrt(vhat) + eps) + weight_decay * master); then params (param_dt) = master
// rounded (stochastically for bf16, by (seed, offset + i), so every rank holding a parameter gets the
// same bits). When param_dt is fp32, params may alias master. offset = the span's canonical offset.
void adamw_update(Backend* be, void* params, DType param_dt, float* master, const void* grads, DType grad_dt,
                  float* m, float* v, size_t n, size_t offset, const AdamWArgs* args);

// *acc (one fp32 in backend memory) += sum of x[i]^2 over n elements. Deterministic.
void sum_squares(Backend* be, DType dt, float* acc, const void* x, size_t n);

// The optimizer's whole step as lists, so a backend may batch what would be hundreds of small launches.
// Each list call gives exactly the bits of the per-span calls it stands for, in its order.

// One span of adamw_update (backend pointers); weight_decay replaces AdamWArgs.weight_decay for it.
typedef struct {
    void* params;
    float* master;
    const void* grads;
    float* m;
    float* v;
    size_t n, offset;
    float weight_decay;
} AdamWSpan;

// For each spans[i] in order (spans: a host array of count): adamw_update(be, params, param_dt, master,
// grads, grad_dt, m, v, n, offset, args with weight_decay = spans[i].weight_decay). No span may write memory
// another span reads or writes (a backend may update them at once), as the model state's spans never do.
void adamw_update_spans(Backend* be, DType param_dt, DType grad_dt, const AdamWSpan* spans, int count,
                        const AdamWArgs* args);

// For i = 0 .. count - 1 in order: sum_squares(be, dt, acc, x[i], n[i]). x and n are host arrays.
void sum_squares_spans(Backend* be, DType dt, float* acc, const void* const* x, const size_t* n, int count);

#ifdef __cplusplus
}
#endif
