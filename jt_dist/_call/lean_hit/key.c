/* The lean key of an all-defaults triton_call, as jt_dist/_call/lean.py
 * builds it (the reference): the same tuple, so that either can file an
 * entry the other finds. */
#include "lean_hit.h"

/* Miss(key): the call goes through the full path, which files its entry
 * under key (None: no lean key). Steals nothing. */
PyObject *make_miss(PyObject *key) {
  return PyObject_CallFunctionObjArgs(miss_type, key ? key : Py_None, NULL);
}

/* The arrays' (shape, dtype) pairs, or NULL with no error set where an
 * argument is not a concrete jax.Array of the exact type. */
static PyObject *array_part(PyObject *args) {
  Py_ssize_t n = PyTuple_Size(args);
  PyObject *out = PyTuple_New(n);
  if (out == NULL) return NULL;
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *a = PyTuple_GetItem(args, i);
    if ((PyObject *)Py_TYPE(a) != array_type) goto no_key;
    /* a.shape and a.dtype are Python properties reading a.aval's. */
    PyObject *aval = PyObject_GetAttr(a, s_aval);
    if (aval == NULL) goto no_key;
    PyObject *shape = PyObject_GetAttr(aval, s_shape);
    PyObject *dtype = shape ? PyObject_GetAttr(aval, s_dtype) : NULL;
    Py_DECREF(aval);
    if (dtype == NULL) {
      Py_XDECREF(shape);
      goto no_key;
    }
    PyObject *pair = PyTuple_Pack(2, shape, dtype);
    Py_DECREF(shape);
    Py_DECREF(dtype);
    if (pair == NULL) goto no_key;
    PyTuple_SetItem(out, i, pair);
  }
  return out;
no_key:
  PyErr_Clear();
  Py_DECREF(out);
  return NULL;
}

/* A tuple of f(item) for the items of tuple t: their types. */
static PyObject *types_of(PyObject *t) {
  Py_ssize_t n = PyTuple_Size(t);
  PyObject *out = PyTuple_New(n);
  if (out == NULL) return NULL;
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *type = (PyObject *)Py_TYPE(PyTuple_GetItem(t, i));
    Py_INCREF(type);
    PyTuple_SetItem(out, i, type);
  }
  return out;
}

/* The metaparams' (name, value, type(value)) triples, in the dict's order. */
static PyObject *metaparam_part(PyObject *metaparams) {
  PyObject *out = PyTuple_New(PyDict_Size(metaparams));
  if (out == NULL) return NULL;
  Py_ssize_t pos = 0, i = 0;
  PyObject *k, *v;
  while (PyDict_Next(metaparams, &pos, &k, &v)) {
    PyObject *triple = PyTuple_Pack(3, k, v, (PyObject *)Py_TYPE(v));
    if (triple == NULL) {
      Py_DECREF(out);
      return NULL;
    }
    PyTuple_SetItem(out, i++, triple);
  }
  return out;
}

/* Whether eager keys may be built now: found once, then the top-level
 * probe. -1 with an error set if finding them failed. */
int at_top_level(void) {
  if (array_type == NULL) {
    PyObject *found = PyObject_CallNoArgs(eager_ready);
    if (found == NULL) return -1;
    if (found == Py_None) {
      Py_DECREF(found);
      return 0;
    }
    array_type = PyTuple_GetItem(found, 0);
    top_level = PyTuple_GetItem(found, 1);
    if (array_type == NULL || top_level == NULL) {
      Py_DECREF(found);
      array_type = top_level = NULL;
      return -1;
    }
    Py_INCREF(array_type);
    Py_INCREF(top_level);
    Py_DECREF(found);
  }
  if (!PyTuple_Check(top_level)) {
    PyObject *answer = PyObject_CallNoArgs(top_level);
    if (answer == NULL) return -1;
    int yes = PyObject_IsTrue(answer);
    Py_DECREF(answer);
    return yes;
  }
  /* (state, value) pairs: at top level where each state's value is its
   * partner (jax_runtime.top_level_states). */
  Py_ssize_t n = PyTuple_Size(top_level);
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *pair = PyTuple_GetItem(top_level, i);
    PyObject *value = PyObject_GetAttr(PyTuple_GetItem(pair, 0), s_value);
    if (value == NULL) return -1;
    Py_DECREF(value);  /* compared by identity alone */
    if (value != PyTuple_GetItem(pair, 1)) return 0;
  }
  return 1;
}

/* lean.key's tuple, or None (a new reference either way; NULL on a failure
 * of the probe alone). */
PyObject *make_key(PyObject *args, PyObject *kernel,
                          PyObject *out_shape, PyObject *grid,
                          PyObject *metaparams);
PyObject *read_env(PyObject *kernel);

/* Whether the call may have a lean key: 1, 0, or -1 with an error set. */
int may_have_key(PyObject *out_shape, PyObject *grid) {
  if (!PyTuple_CheckExact(grid) || (PyObject *)Py_TYPE(out_shape) != sds_type)
    return 0;
  return at_top_level();
}

PyObject *build_key(PyObject *args, PyObject *kernel,
                           PyObject *out_shape, PyObject *grid,
                           PyObject *metaparams) {
  int may = may_have_key(out_shape, grid);
  if (may < 0) return NULL;
  if (!may) Py_RETURN_NONE;
  return make_key(args, kernel, out_shape, grid, metaparams);
}

/* build_key past its checks. */
PyObject *make_key(PyObject *args, PyObject *kernel,
                          PyObject *out_shape, PyObject *grid,
                          PyObject *metaparams) {
  PyObject *arrays = array_part(args);
  if (arrays == NULL) Py_RETURN_NONE;
  PyObject *parts[10] = {NULL};
  parts[0] = PyLong_FromVoidPtr(kernel);
  parts[1] = arrays;
  parts[2] = PyObject_GetAttr(out_shape, s_shape);
  parts[3] = parts[2] ? PyObject_GetAttr(out_shape, s_dtype) : NULL;
  parts[4] = parts[3] ? PyObject_GetAttr(out_shape, s_sharding) : NULL;
  parts[5] = parts[4] ? PyObject_GetAttr(out_shape, s_weak_type) : NULL;
  parts[6] = grid;
  Py_INCREF(grid);
  parts[7] = parts[5] ? types_of(grid) : NULL;
  parts[8] = parts[7] ? metaparam_part(metaparams) : NULL;
  if (parts[8] != NULL) parts[9] = read_env(kernel);
  PyObject *key = NULL;
  if (parts[0] && parts[9]) {
    key = PyTuple_New(10);
    if (key != NULL) {
      for (int i = 0; i < 10; i++) PyTuple_SetItem(key, i, parts[i]);
      return key;
    }
  }
  for (int i = 0; i < 10; i++) Py_XDECREF(parts[i]);
  /* As lean.key: any failure past the probe means no key. */
  PyErr_Clear();
  Py_RETURN_NONE;
}

/* The settings an entry holds, as the Python reader (sync_env or
 * autotune_env) gives them: read from os.environ's data where it is still
 * the object configure saw. */
PyObject *read_env(PyObject *kernel) {
  int plain = (PyObject *)Py_TYPE(kernel) == plain_kernel;
  if (environ_data != NULL) {
    /* os.environ, read from the module's dict (no attribute lookup). */
    PyObject *now = PyDict_GetItemWithError(os_module, s_environ);
    if (now == NULL && PyErr_Occurred()) return NULL;
    if (now == environ_obj) {
      PyObject *keys = plain ? sync_keys : autotune_keys;
      Py_ssize_t n = PyTuple_Size(keys);
      PyObject *values = n == 1 ? NULL : PyTuple_New(n);
      if (n != 1 && values == NULL) return NULL;
      for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyDict_GetItemWithError(environ_data,
                                              PyTuple_GetItem(keys, i));
        if (v == NULL) {
          if (PyErr_Occurred()) {
            Py_XDECREF(values);
            return NULL;
          }
          v = Py_None;
        }
        Py_INCREF(v);
        if (n == 1) return v;
        PyTuple_SetItem(values, i, v);
      }
      return values;
    }
  }
  return PyObject_CallNoArgs(plain ? sync_env : autotune_env);
}
