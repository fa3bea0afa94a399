// An empty Python module, so that `import fp8mp._C` loads the shared library
// and runs its TORCH_LIBRARY registrations. The ops themselves are reached
// through torch.ops.fp8mp, not through this module.
#include <Python.h>

extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}
