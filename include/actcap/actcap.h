// actcap's public API in one include: load a Hugging Face checkpoint (model.h), split it across
// devices for a run (split.h, planner.h, devices.h, executor.h), capture hook points safely
// (capture.h, hooks.h, observer.h; snapshot.h for tensors from elsewhere), prove a split run
// equals a single-device one (compare.h), export and verify activation folders (export.h,
// extract.h; ranks.h for one dataset from many processes), generate with a KV cache capturing
// every token (generate.h), and the building blocks under them (safetensors.h, checkpoint.h,
// config.h, tokenizer.h, hash.h). examples/embed.cpp is a short program over it.
#pragma once

#include "actcap/capture.h"
#include "actcap/checkpoint.h"
#include "actcap/compare.h"
#include "actcap/config.h"
#include "actcap/devices.h"
#include "actcap/diagnostics.h"
#include "actcap/error.h"
#include "actcap/executor.h"
#include "actcap/export.h"
#include "actcap/extract.h"
#include "actcap/generate.h"
#include "actcap/hash.h"
#include "actcap/hooks.h"
#include "actcap/init_model.h"
#include "actcap/model.h"
#include "actcap/numbers.h"
#include "actcap/observer.h"
#include "actcap/planner.h"
#include "actcap/ranks.h"
#include "actcap/repro.h"
#include "actcap/safetensors.h"
#include "actcap/snapshot.h"
#include "actcap/split.h"
#include "actcap/tokenizer.h"
