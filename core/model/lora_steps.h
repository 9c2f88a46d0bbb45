// lora_steps.h: the adapters' forward and backward (lora.h), which a block calls right after each LoRA
// target's matmul. Composed of the existing kernels (matmul_forward/backward on the small matrices,
// be_copy_rows for a fused output's column block, residual_forward for the additions; lora_dropout on the
// input and on its gradient in a training forward and backward with -lora-dropout), so the CPU and the GPU
// build run the same code. Each call does nothing for a model without LoRA or a target the run does not
// adapt, so the base path's bits are untouched; with B = 0 the addition is exactly zero.
#pragma once
#include "core/model/block.h"
#include "core/model/walk.h"

// The adapters' work buffers (bytes; 0 without LoRA) and the buffers themselves in g (model_create).
size_t lora_work_bytes(const ParamLayout* lay, DType dt, int B, int T);
void lora_work_create(Model* g, Backend* be, MemLedger* mem);
void lora_work_destroy(Model* g, Backend* be);
// Whether the run adapts target `target` (its index in the family's list).
int lora_adapts(const Model* g, int target);
// out's column block of target `target` (its index in the family's list) += scale * (inp A^T) B^T.
void lora_forward(Model* g, Backend* be, const BlockRef* b, int target, void* out, const void* inp);
// Its backward: dout is the gradient of the whole (fused) output, inp the target's input; the input gradient
// dinp, which the base's matmul_step has written, gets the adapters' share added (through GELU's derivative
// at pre when the input is gelu(pre)); dA and dB accumulate (B mode: dinp only; W mode: dA and dB only).
void lora_backward(BlockBackward* c, const BlockRef* b, int target, void* dinp, const void* dout, const void* inp, const void* pre);
