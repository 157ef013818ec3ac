/* A stand-in for the NVIDIA driver's libcuda.so.1 that shows one device, so that the binary's
 * handling of a GPU node whose plugin cannot load is tested on machines without a GPU
 * (test_cuda_plugin.cpp). Only the calls the binary's driver probe makes. */
int cuInit(unsigned flags) {
  (void)flags;
  return 0;
}
int cuDeviceGetCount(int* count) {
  *count = 1;
  return 0;
}
