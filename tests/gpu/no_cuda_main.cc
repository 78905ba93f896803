// Stand-in for the real-GPU programs (kvc_gpu_bench, kvc_longctx_demo) in a build without
// CUDA: same name, same SKIP line and JSON, exit 0, so scripts treat both cases alike.
#include <cstdio>
#include <cstring>
#include <string>

int main(int argc, char** argv) {
  std::printf("SKIP: no CUDA device (%s was built without CUDA: nvcc not found at configure)\n",
              KVC_PROGRAM_NAME);
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) {
      if (FILE* f = std::fopen(argv[i + 1], "w")) {
        std::fprintf(f, "{\"skipped\": \"no CUDA device (built without CUDA)\"}\n");
        std::fclose(f);
      }
    }
  }
  return 0;
}
