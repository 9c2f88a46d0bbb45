// lora_peft.h: `-lora-init DIR`, a Hugging Face PEFT adapter folder read by the trainer itself (no script
// between): adapter_config.json (peft_type LORA, r, lora_alpha, use_rslora, target_modules, bias) and
// adapter_model.safetensors, whose tensors base_model.model.<module>.lora_A.weight (R, in) and .lora_B.weight
// (out, R) are the adapter file's A and B (lora.h) under the family's Hugging Face module names
// (ModelFamily.lora_hf_blocks, lora_hf_modules); F32, BF16 and F16 are read, widened exactly to fp32.
// The folder must be an adapter of this run: r, lora_alpha and use_rslora equal to -lora, -lora-alpha and
// -lora-rslora, target_modules selecting in every layer exactly the targets -lora-targets selects, and the
// tensors exactly those, of the run's shapes. Anything else (another base, rank or targets, DoRA and PEFT's
// other variants, a bias, a missing, extra, truncated or non-float tensor) is one line naming it.
#pragma once
#include "core/model/model.h"

// 1 when path is a directory: -lora-init reads it as a PEFT adapter folder, a file as lora.h's adapter file.
int lora_peft_is_folder(const char* path);
// Reads the folder's adapters into flat (the layout's part: a stage's layers, a tensor rank's shards)
// after the checks above.
void lora_peft_read(const char* folder, const ParamLayout* lay, float* flat);
