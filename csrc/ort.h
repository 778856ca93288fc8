// The one place that includes the ONNX Runtime C++ API. The library is loaded at run time
// (runtime.cpp), so the API table is initialised by hand: every file must see this define.
#pragma once

#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>
