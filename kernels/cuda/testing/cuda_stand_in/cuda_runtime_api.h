// A stand-in: see cuda_stand_in.h.
#include "cuda_stand_in.h"
