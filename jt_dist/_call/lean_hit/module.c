/* jt_dist._call._lean_hit, the compiled eager hit: the lookup of an
 * all-defaults triton_call's cached entry, and the call of its executable.
 * This file runs a hit and is the module; key.c builds the key, memo.c
 * keeps the last hits.
 *
 * jt_dist/_call/lean.py holds the same logic in Python and is the
 * reference: the key built here is the very same tuple (so either can file
 * an entry that the other finds), and every decision other than "hit or
 * not" is left to Python. It exists because an eager call right after a
 * sync runs cold: each Python frame and attribute lookup on the hit costs
 * several times its hot price there (benchmarks/python_wall_cost.py), and
 * the hit's bytecode was most of jt_dist's share of an eager call.
 *
 * Limited API (abi3) for Python 3.11 and newer: one build serves them all.
 */
#include <stddef.h>

#include "lean_hit.h"

/* The state lean_hit.h declares. */
PyObject *miss_type, *sds_type, *plain_kernel, *entries, *eager_ready,
    *sync_env, *autotune_env, *on_error, *unflatten;
PyObject *os_module, *environ_obj, *environ_data, *sync_keys, *autotune_keys;
PyObject *array_type, *top_level;
PyObject *s_value, *s_environ, *s_aval, *s_shape, *s_dtype, *s_sharding,
    *s_weak_type, *s_jit_fn, *s_src, *s_fn, *s_single, *s_out_tree,
    *s__sharding, *s__src;
Slot memo[N_MEMO];
unsigned memo_next;

static PyObject *lean_key(PyObject *self, PyObject *const *a, Py_ssize_t n) {
  if (n != 5 || !PyTuple_Check(a[0]) || !PyDict_Check(a[4])) {
    PyErr_SetString(PyExc_TypeError,
                    "key(args, kernel, out_shape, grid, metaparams)");
    return NULL;
  }
  return build_key(a[0], a[1], a[2], a[3], a[4]);
}

/* Calls the slot's executable; Miss(key) where lean.py's call would answer
 * MISS. */
static PyObject *run_entry(Slot *slot, PyObject *args) {
  PyObject *outs = PyObject_Call(slot->fn, args, NULL);
  if (outs == NULL) {
    PyObject *type, *exc, *tb;
    PyErr_Fetch(&type, &exc, &tb);
    PyErr_NormalizeException(&type, &exc, &tb);
    if (tb != NULL) PyException_SetTraceback(exc, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    if (exc == NULL) return NULL;
    PyObject *answer =
        PyObject_CallFunctionObjArgs(on_error, slot->entry, exc, NULL);
    Py_DECREF(exc);
    if (answer == NULL) return NULL;
    Py_DECREF(answer); /* "take the full path": on_error raises otherwise */
    return make_miss(slot->key);
  }
  PyObject *result;
  if (slot->single)
    result = PySequence_GetItem(outs, 0);
  else
    result = PyObject_CallFunctionObjArgs(unflatten, slot->out_tree, outs,
                                          NULL);
  Py_DECREF(outs);
  return result;
}

/* Runs the call from its slot, unless its kernel's source changed. */
static PyObject *run_slot(Slot *slot, PyObject *args) {
  PyObject *now =
      PyObject_GetAttr(slot->jit_fn, slot->src_direct ? s__src : s_src);
  Py_XDECREF(now); /* compared by identity alone */
  if (now != slot->src) {
    /* The kernel's source changed (or cannot be read): the full path. */
    PyErr_Clear();
    return make_miss(slot->key);
  }
  return run_entry(slot, args);
}

/* Runs the call from its lean key's entry, found in the entries, and files
 * it in the memo; Miss(key) where there is none. */
static PyObject *run_found(PyObject *const *a) {
  PyObject *key = make_key(a[0], a[1], a[2], a[3], a[4]);
  if (key == NULL) return NULL;
  if (key == Py_None) {
    Py_DECREF(key);
    return make_miss(NULL);
  }
  PyObject *entry = PyDict_GetItemWithError(entries, key);
  Py_XINCREF(entry); /* borrowed from a dict that other code may change */
  PyObject *result = NULL;
  Slot fresh = {0};
  if (entry != NULL) {
    int laid_out = lay_out_key(&fresh, key);
    if (fill_slot(&fresh, key, entry)) {
      if (laid_out) memo_write((int)(memo_next++ % N_MEMO), &fresh);
      result = run_slot(&fresh, a[0]);
    }
    slot_release(&fresh);
  }
  if (result == NULL && !PyErr_Occurred()) {
    result = make_miss(key);
  } else if (result == NULL && PyErr_ExceptionMatches(PyExc_TypeError) &&
             entry == NULL) {
    /* An unhashable metaparam: the full path reports it (TypeError). */
    PyErr_Clear();
    result = make_miss(key);
  }
  Py_XDECREF(entry);
  Py_DECREF(key);
  return result;
}

/* hit(args, kernel, out_shape, grid, kwargs): the outputs, or Miss(key).
 *
 * A call naming one of triton_call's options never hits: no key filed in
 * the entries has an option's name among its metaparams. */
static PyObject *lean_hit(PyObject *self, PyObject *const *a, Py_ssize_t n) {
  if (n != 5 || !PyTuple_Check(a[0]) || !PyDict_Check(a[4])) {
    PyErr_SetString(PyExc_TypeError,
                    "hit(args, kernel, out_shape, grid, kwargs)");
    return NULL;
  }
  int may = may_have_key(a[2], a[3]);
  if (may < 0) return NULL;
  if (!may) return make_miss(NULL);
  Slot found;
  if (!memo_find(a[0], a[1], a[2], a[3], a[4], &found)) return run_found(a);
  PyObject *result = run_slot(&found, a[0]);
  slot_release(&found);
  return result;
}

static PyObject *configure(PyObject *self, PyObject *a) {
  PyObject *objs[9], *env_parts;
  if (!PyArg_ParseTuple(a, "OOOO!OOOOOO", &objs[0], &objs[1], &objs[2],
                        &PyDict_Type, &objs[3], &objs[4], &objs[5], &objs[6],
                        &objs[7], &objs[8], &env_parts))
    return NULL;
  PyObject *env[5] = {NULL};
  if (env_parts != Py_None &&
      !PyArg_ParseTuple(env_parts, "O!OO!O!O!", &PyDict_Type, &env[0], &env[1],
                        &PyDict_Type,
                        &env[2], &PyTuple_Type, &env[3], &PyTuple_Type,
                        &env[4]))
    return NULL;
  PyObject **env_slots[5] = {&os_module, &environ_obj, &environ_data,
                             &sync_keys, &autotune_keys};
  for (int i = 0; i < 5; i++) {
    PyObject *old = *env_slots[i];
    Py_XINCREF(env[i]);
    *env_slots[i] = env[i];
    Py_XDECREF(old);
  }
  PyObject **slots[9] = {&miss_type, &sds_type, &plain_kernel, &entries,
                         &eager_ready, &sync_env, &autotune_env, &on_error,
                         &unflatten};
  for (int i = 0; i < 9; i++) {
    PyObject *old = *slots[i];
    Py_INCREF(objs[i]);
    *slots[i] = objs[i];
    Py_XDECREF(old);
  }
  Py_CLEAR(array_type);
  Py_CLEAR(top_level);
  return forget(self, NULL);
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS,
     "configure(miss_type, sds_type, plain_kernel, entries, "
     "eager_ready, sync_env, autotune_env, on_error, unflatten, env_parts)"},
    {"forget", forget, METH_NOARGS,
     "forget(): empties the memo of last hits (the entries changed)."},
    {"key", (PyCFunction)(void (*)(void))lean_key, METH_FASTCALL,
     "key(args, kernel, out_shape, grid, metaparams): lean.key's tuple."},
    {"hit", (PyCFunction)(void (*)(void))lean_hit, METH_FASTCALL,
     "hit(args, kernel, out_shape, grid, kwargs): outputs, or Miss(key)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_lean_hit",
    "The eager lean hit in C (jt_dist/_call/lean.py is the reference).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__lean_hit(void) {
  static const char *names[] = {"value", "environ", "aval", "shape",
                                "dtype", "sharding", "weak_type", "jit_fn",
                                "src", "fn", "single", "out_tree",
                                "_sharding", "_src"};
  PyObject **interned[] = {&s_value, &s_environ, &s_aval, &s_shape,
                           &s_dtype, &s_sharding, &s_weak_type, &s_jit_fn,
                           &s_src, &s_fn, &s_single, &s_out_tree,
                           &s__sharding, &s__src};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    *interned[i] = PyUnicode_InternFromString(names[i]);
    if (*interned[i] == NULL) return NULL;
  }
  return PyModule_Create(&module);
}
