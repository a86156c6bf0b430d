"""The toy kernels on CUDA (numba.cuda): not built yet; the GPU backend is a later issue."""
