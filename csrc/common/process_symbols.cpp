#include "common/process_symbols.h"

#include <dlfcn.h>

namespace fp8mp {

void* find_process_symbol(const char* name) {
  if (void* sym = dlsym(RTLD_DEFAULT, name)) return sym;
  // torch loads libtorch_cpu with RTLD_LOCAL under some launchers: ask for it by name, never loading it anew.
  if (void* lib = dlopen("libtorch_cpu.so", RTLD_LAZY | RTLD_NOLOAD)) return dlsym(lib, name);
  return nullptr;
}

}  // namespace fp8mp
