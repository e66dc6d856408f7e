// qkv: the transformer in C++. Include this for the whole public API.
#pragma once
#include "qkv/attention.h"
#include "qkv/cpu.h"
#include "qkv/error.h"
#include "qkv/gemm.h"
#include "qkv/npy.h"
#include "qkv/parallel.h"
#include "qkv/tensor.h"
