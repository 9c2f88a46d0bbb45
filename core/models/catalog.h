// catalog.h: the model families the trainer knows (family.h), and the -e shapes and model files that name
// them. Adding a family is its folder under core/models/ plus one entry in catalog.c.
#pragma once
#include "core/model/family.h"

// The shape -e names: a family's named shape or custom spec (each family's parse_spec in turn). Returns 0
// when `spec` is none of them (then it names a model file); fails on a malformed spec of a family.
int shape_from_spec(const char* spec, ModelShape* out);
// The family of a model file's header slot 8, or NULL.
const ModelFamily* family_of_file_id(int id);
