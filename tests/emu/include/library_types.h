// library_types.h (emulated): CUDA's data-type enumeration, as CUDA's own library_types.h spells it (names and
// values), for cuda_runtime.h and cublasLt.h. The emulated cuBLASLt computes with CUDA_R_32F, CUDA_R_16BF
// and CUDA_R_16F; it refuses the others where they are passed to it.
#pragma once

typedef enum cudaDataType_t {
    CUDA_R_32F = 0,
    CUDA_R_64F = 1,
    CUDA_R_16F = 2,
    CUDA_R_8I = 3,
    CUDA_C_32F = 4,
    CUDA_C_64F = 5,
    CUDA_C_16F = 6,
    CUDA_C_8I = 7,
    CUDA_R_8U = 8,
    CUDA_C_8U = 9,
    CUDA_R_32I = 10,
    CUDA_C_32I = 11,
    CUDA_R_16BF = 14,
    CUDA_C_16BF = 15,
    CUDA_R_8F_E4M3 = 28,
    CUDA_R_8F_E5M2 = 29,
} cudaDataType_t;
typedef cudaDataType_t cudaDataType;
