// optimizer_kind.h: what an optimizer asks of the model states, as a description the layers below it read
// instead of naming one optimizer: whether it changes a parameter at all (then it holds an fp32 master copy
// of it) and which fp32 buffers it keeps per parameter besides (AdamW: m and v). The holder (zero.c)
// allocates them, the state files write and read them, the disk store chunks them, the planner and
// --estimate count them, all from this description. Each parameter kind carries its optimizer
// (KindInfo.optimizer, family.h); the step (core/zero/optimizer.c) runs each updating optimizer over the
// spans of its kinds.
//
// A frozen kind is never updated: no master, no state, nothing in the state files, outside the gradient
// norm; its working copy keeps the values it was given (initialization, a model file).
#pragma once

// OPT_ADAMW is 0, so a kind that names no optimizer is AdamW's.
typedef enum { OPT_ADAMW, OPT_FROZEN, NUM_OPTIMIZERS } OptimizerId;

#define OPT_MAX_STATE 2   // the most state buffers any optimizer keeps per parameter

typedef struct {
    const char* name;
    int updates;       // changes its parameters: holds an fp32 master and is stepped; 0: frozen
    int num_state;     // fp32 buffers per parameter besides the master, in the order the state files hold them
    const char* state_names[OPT_MAX_STATE];
} OptimizerKind;

const OptimizerKind* optimizer_kind(OptimizerId id);

// The fp32 values an optimizer holds per parameter: the master and its state buffers; 0 when frozen. A
// span's buffers are numbered so: 0 the master, 1 + k state buffer k (model_state.h's SPAN_MASTER + i).
static inline int optimizer_buffers(const OptimizerKind* o) { return o->updates ? 1 + o->num_state : 0; }
