/* The memo of last hits: a call is compared with each slot field by field,
 * without building its key (lean_hit.h says how a slot is laid out and
 * why it is safe under threads). */
#include "lean_hit.h"

/* 1 if a == b (identity first, as a dict lookup compares), 0 if not, -1 on
 * an error. */
int same(PyObject *a, PyObject *b) {
  return a == b ? 1 : PyObject_RichCompareBool(a, b, Py_EQ);
}

/* An exact int's value in *out; 0 where v is no exact int or too large. */
static int int_value(PyObject *v, long long *out) {
  if (!PyLong_CheckExact(v)) return 0;
  int overflow;
  *out = PyLong_AsLongLongAndOverflow(v, &overflow);
  if (overflow || (*out == -1 && PyErr_Occurred())) {
    PyErr_Clear();
    return 0;
  }
  return 1;
}

/* Whether v equals a slot's value `want` of type `type` (and int value
 * `want_int` where int_ok); -1 on an error. */
static int value_matches(PyObject *v, PyObject *want, PyObject *type,
                         long long want_int, char int_ok) {
  if ((PyObject *)Py_TYPE(v) != type) return 0;
  if (v == want) return 1;
  long long x;
  if (int_ok && int_value(v, &x)) return x == want_int;
  return PyObject_RichCompareBool(v, want, Py_EQ);
}

/* Whether the call's arrays have the slot's shapes and dtypes; -1 on an
 * error. */
static int arrays_match(PyObject *args, Slot *slot) {
  if (PyTuple_Size(args) != slot->n_args) return 0;
  for (Py_ssize_t i = 0; i < slot->n_args; i++) {
    PyObject *a = PyTuple_GetItem(args, i);
    if ((PyObject *)Py_TYPE(a) != array_type) return 0;
    PyObject *aval = PyObject_GetAttr(a, s_aval);
    if (aval == NULL) return -1;
    if (aval == slot->avals[i]) {
      Py_DECREF(aval);
      continue;
    }
    PyObject *shape = PyObject_GetAttr(aval, s_shape);
    PyObject *dtype = shape ? PyObject_GetAttr(aval, s_dtype) : NULL;
    int ok = dtype == NULL ? -1 : same(shape, slot->shapes[i]);
    if (ok == 1) ok = same(dtype, slot->dtypes[i]);
    Py_XDECREF(shape);
    Py_XDECREF(dtype);
    if (ok == 1) {
      Py_XDECREF(slot->avals[i]);
      slot->avals[i] = aval; /* the reference moves to the slot */
    } else {
      Py_DECREF(aval);
      return ok;
    }
  }
  return 1;
}

/* Whether the attribute `name` of `obj` equals `want`; -1 on an error. */
static int attr_is(PyObject *obj, PyObject *name, PyObject *want) {
  PyObject *got = PyObject_GetAttr(obj, name);
  if (got == NULL) return -1;
  int ok = same(got, want);
  Py_DECREF(got);
  return ok;
}

/* Whether out_shape.sharding is `want`. Where both are unset, the
 * ShapeDtypeStruct's own slot tells, without the property's Python frame:
 * the property gives its slot back unless that holds a PartitionSpec. */
static int sharding_is(PyObject *out_shape, PyObject *want) {
  if (want == Py_None) {
    PyObject *held = PyObject_GetAttr(out_shape, s__sharding);
    Py_XDECREF(held); /* compared by identity alone */
    if (held == Py_None) return 1;
    PyErr_Clear();
  }
  return attr_is(out_shape, s_sharding, want);
}

/* Whether the grid and the metaparams (in order) are the slot's. */
static int scalars_match(PyObject *grid, PyObject *metaparams, Slot *slot) {
  if (!PyTuple_CheckExact(grid) || PyTuple_Size(grid) != slot->n_grid ||
      PyDict_Size(metaparams) != slot->n_meta)
    return 0;
  int ok = 1;
  for (Py_ssize_t i = 0; ok == 1 && i < slot->n_grid; i++)
    ok = value_matches(PyTuple_GetItem(grid, i), slot->grid[i],
                       slot->grid_type[i], slot->grid_int[i],
                       slot->grid_int_ok[i]);
  Py_ssize_t pos = 0, i = 0;
  PyObject *k, *v;
  while (ok == 1 && PyDict_Next(metaparams, &pos, &k, &v)) {
    ok = same(k, slot->meta_name[i]);
    if (ok == 1)
      ok = value_matches(v, slot->meta_value[i], slot->meta_type[i],
                         slot->meta_int[i], slot->meta_int_ok[i]);
    i++;
  }
  return ok;
}

/* Whether the call has the slot's lean key, compared part by part without
 * building its own. The top-level probe has run. */
static int key_matches(Slot *slot, PyObject *args, PyObject *kernel,
                       PyObject *out_shape, PyObject *grid,
                       PyObject *metaparams) {
  if (slot->kernel != (void *)kernel ||
      (PyObject *)Py_TYPE(out_shape) != sds_type)
    return 0;
  int ok = scalars_match(grid, metaparams, slot);
  if (ok == 1) ok = arrays_match(args, slot);
  if (ok == 1) ok = attr_is(out_shape, s_shape, slot->out_shape);
  if (ok == 1) ok = attr_is(out_shape, s_dtype, slot->out_dtype);
  if (ok == 1) ok = sharding_is(out_shape, slot->out_sharding);
  if (ok == 1) ok = attr_is(out_shape, s_weak_type, slot->out_weak);
  if (ok == 1) {
    PyObject *now = read_env(kernel);
    if (now == NULL) return -1;
    ok = same(now, slot->env);
    Py_DECREF(now);
  }
  return ok;
}

/* Takes (retain) or lets go (release) the references a slot holds; the
 * parts laid out flat are borrowed from its key. */
void slot_retain(Slot *slot) {
  Py_XINCREF(slot->key);
  Py_XINCREF(slot->entry);
  Py_XINCREF(slot->fn);
  Py_XINCREF(slot->jit_fn);
  Py_XINCREF(slot->src);
  Py_XINCREF(slot->out_tree);
  /* Avals are kept only where the slot's key was laid out (n_args). */
  for (Py_ssize_t i = 0; i < slot->n_args && i < N_ITEMS; i++)
    Py_XINCREF(slot->avals[i]);
}

void slot_release(Slot *slot) {
  Py_CLEAR(slot->key);
  Py_CLEAR(slot->entry);
  Py_CLEAR(slot->fn);
  Py_CLEAR(slot->jit_fn);
  Py_CLEAR(slot->src);
  Py_CLEAR(slot->out_tree);
  for (Py_ssize_t i = 0; i < slot->n_args && i < N_ITEMS; i++)
    Py_CLEAR(slot->avals[i]);
}

/* Writes `fresh` (its references copied) into memo slot i, bumping its
 * version; what the slot held is let go last. */
void memo_write(int i, const Slot *fresh) {
  Slot old = memo[i];
  unsigned version = memo[i].version + 1;
  memo[i] = *fresh;
  slot_retain(&memo[i]);
  memo[i].version = version;
  slot_release(&old);
}

/* Keeps the avals a match saw in memo slot i, unless it changed since. */
static void memo_keep_avals(int i, unsigned version, const Slot *seen) {
  for (Py_ssize_t k = 0; k < seen->n_args && memo[i].version == version;
       k++) {
    PyObject *old = memo[i].avals[k];
    if (old == seen->avals[k]) continue;
    Py_INCREF(seen->avals[k]);
    memo[i].avals[k] = seen->avals[k];
    Py_XDECREF(old);
  }
}

/* Whether a memo slot has the call's key; if so, *found is a copy of it
 * whose references the caller releases. Errors are cleared: the full key
 * then decides. */
int memo_find(PyObject *args, PyObject *kernel, PyObject *out_shape,
                     PyObject *grid, PyObject *metaparams, Slot *found) {
  for (int i = 0; i < N_MEMO; i++) {
    if (memo[i].key == NULL || memo[i].kernel != (void *)kernel) continue;
    unsigned version = memo[i].version;
    *found = memo[i];
    slot_retain(found);
    int ok = key_matches(found, args, kernel, out_shape, grid, metaparams);
    if (ok == 1 && memo[i].version == version) {
      memo_keep_avals(i, version, found);
      return 1;
    }
    if (ok < 0) PyErr_Clear();
    slot_release(found);
  }
  return 0;
}

/* Lays out a build_key tuple's parts in the slot (borrowed from it); 0
 * where it has more items than a slot holds. */
int lay_out_key(Slot *slot, PyObject *key) {
  PyObject *arrays = PyTuple_GetItem(key, 1);
  PyObject *grid = PyTuple_GetItem(key, 6);
  PyObject *types = PyTuple_GetItem(key, 7);
  PyObject *triples = PyTuple_GetItem(key, 8);
  slot->n_args = PyTuple_Size(arrays);
  slot->n_grid = PyTuple_Size(grid);
  slot->n_meta = PyTuple_Size(triples);
  if (slot->n_args > N_ITEMS || slot->n_grid > N_ITEMS ||
      slot->n_meta > N_ITEMS)
    return 0;
  slot->kernel = PyLong_AsVoidPtr(PyTuple_GetItem(key, 0));
  for (Py_ssize_t i = 0; i < slot->n_args; i++) {
    slot->shapes[i] = PyTuple_GetItem(PyTuple_GetItem(arrays, i), 0);
    slot->dtypes[i] = PyTuple_GetItem(PyTuple_GetItem(arrays, i), 1);
  }
  for (Py_ssize_t i = 0; i < slot->n_grid; i++) {
    slot->grid[i] = PyTuple_GetItem(grid, i);
    slot->grid_type[i] = PyTuple_GetItem(types, i);
    slot->grid_int_ok[i] = int_value(slot->grid[i], &slot->grid_int[i]);
  }
  for (Py_ssize_t i = 0; i < slot->n_meta; i++) {
    PyObject *triple = PyTuple_GetItem(triples, i);
    slot->meta_name[i] = PyTuple_GetItem(triple, 0);
    slot->meta_value[i] = PyTuple_GetItem(triple, 1);
    slot->meta_type[i] = PyTuple_GetItem(triple, 2);
    slot->meta_int_ok[i] = int_value(slot->meta_value[i], &slot->meta_int[i]);
  }
  slot->out_shape = PyTuple_GetItem(key, 2);
  slot->out_dtype = PyTuple_GetItem(key, 3);
  slot->out_sharding = PyTuple_GetItem(key, 4);
  slot->out_weak = PyTuple_GetItem(key, 5);
  slot->env = PyTuple_GetItem(key, 9);
  return 1;
}

/* Fills the slot with (key, entry): the entry's executable, source and
 * output structure, read once. 0 (error cleared) where the entry lacks
 * them. */
int fill_slot(Slot *slot, PyObject *key, PyObject *entry) {
  PyObject *fn = PyObject_GetAttr(entry, s_fn);
  PyObject *jit_fn = fn ? PyObject_GetAttr(entry, s_jit_fn) : NULL;
  PyObject *src = jit_fn ? PyObject_GetAttr(entry, s_src) : NULL;
  PyObject *tree = src ? PyObject_GetAttr(entry, s_out_tree) : NULL;
  PyObject *single = tree ? PyObject_GetAttr(entry, s_single) : NULL;
  int one = single ? PyObject_IsTrue(single) : -1;
  Py_XDECREF(single);
  if (one < 0) {
    Py_XDECREF(fn);
    Py_XDECREF(jit_fn);
    Py_XDECREF(src);
    Py_XDECREF(tree);
    PyErr_Clear();
    return 0;
  }
  Py_INCREF(key);
  Py_INCREF(entry);
  slot->key = key;
  slot->entry = entry;
  slot->fn = fn;
  slot->jit_fn = jit_fn;
  slot->src = src;
  slot->out_tree = tree;
  slot->single = one;
  PyObject *held = PyObject_GetAttr(jit_fn, s__src);
  Py_XDECREF(held); /* compared by identity alone */
  slot->src_direct = held == src;
  PyErr_Clear();
  return 1;
}

PyObject *forget(PyObject *self, PyObject *unused) {
  Slot empty = {0};
  for (int i = 0; i < N_MEMO; i++) memo_write(i, &empty);
  Py_RETURN_NONE;
}
