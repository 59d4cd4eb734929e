/* The eager lean hit in C: the key of an all-defaults triton_call, its
 * entry's lookup and the cached executable's call.
 *
 * jt_dist/_call/lean.py holds the same logic in Python and is the reference:
 * this module builds the very same key tuple (so either can file an entry
 * that the other finds), and leaves every decision other than "hit or not"
 * to Python. It exists because an eager call right after a sync runs cold:
 * each Python frame and attribute lookup on the hit costs several times its
 * hot price there (benchmarks/python_wall_cost.py), and the hit's bytecode
 * was most of jt_dist's share of an eager call.
 *
 * Limited API (abi3) for Python 3.11 and newer: one build serves them all.
 */
#ifndef Py_LIMITED_API
#define Py_LIMITED_API 0x030B0000
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* What lean.py hands over (configure), held until the next configure: each
 * a module-level object of jt_dist or jax. */
static PyObject *miss_type;      /* lean.Miss: the answer when not a hit */
static PyObject *sds_type;       /* jax.ShapeDtypeStruct */
static PyObject *plain_kernel;   /* triton's JITFunction */
static PyObject *entries;        /* dict: lean key -> Entry */
static PyObject *eager_ready;    /* () -> (array type, top-level probe) | None */
static PyObject *sync_env;       /* () -> the sync setting */
static PyObject *autotune_env;   /* () -> every setting a launch reads */
static PyObject *on_error;       /* (entry, exc) -> Miss-able sentinel or raise */
static PyObject *error_miss;     /* on_error's "take the full path" answer */
static PyObject *unflatten;      /* jax.tree_util.tree_unflatten */
/* os.environ as environ_reader reads it (NULL where it falls back to the
 * readers above): the os module's dict, the object, its data, the
 * settings' keys. */
static PyObject *os_module, *environ_obj, *environ_data, *sync_keys,
    *autotune_keys;
/* Found at the first eager call at top level (eager_ready). */
static PyObject *array_type;
static PyObject *top_level;

static PyObject *s_value, *s_environ, *s_aval, *s_shape, *s_dtype,
    *s_sharding, *s_weak_type, *s_jit_fn, *s_src, *s_fn, *s_single,
    *s_out_tree, *s__sharding, *s__src;

/* The last hits, matched against a call without building its key: most
 * eager loops repeat one or a few signatures. A slot holds a lean key, its
 * entry, and the key's parts laid out flat (borrowed from the key), so that
 * a match reads this struct and the call's own objects rather than the
 * key's tuples: after a sync, each object read is a likely cache miss.
 * lean.py empties the slots (forget) whenever the entries change.
 *
 * Any Python code run during a match or a call (a property, a finalizer,
 * the executable itself) may let another thread refill or empty a slot. So
 * a call works on its own copy of a slot, whose references it holds, and
 * trusts a match only if the slot's version did not move meanwhile; a slot
 * is changed only by writing it whole and bumping its version, and what it
 * held is let go after. */
#define N_MEMO 4
#define N_ITEMS 8 /* arrays, grid items and metaparams a slot holds */
typedef struct {
  PyObject *key, *entry; /* strong; NULL: an empty slot */
  PyObject *fn, *jit_fn, *src, *out_tree; /* the entry's, strong */
  int single;
  /* Whether jit_fn._src is the source that jit_fn.src gives (Triton's
   * property returns its slot): read without the property's frame. */
  int src_direct;
  void *kernel;
  Py_ssize_t n_args, n_grid, n_meta;
  /* The arrays' avals at the last match, by position (strong): jax shares
   * one aval between the outputs of an executable, so the next call's
   * arrays usually carry the very same objects. */
  PyObject *avals[N_ITEMS];
  PyObject *shapes[N_ITEMS], *dtypes[N_ITEMS];
  PyObject *grid[N_ITEMS], *grid_type[N_ITEMS];
  PyObject *meta_name[N_ITEMS], *meta_value[N_ITEMS], *meta_type[N_ITEMS];
  /* Values of exact ints (int_ok), compared without reading the key's. */
  long long grid_int[N_ITEMS], meta_int[N_ITEMS];
  char grid_int_ok[N_ITEMS], meta_int_ok[N_ITEMS];
  PyObject *out_shape, *out_dtype, *out_sharding, *out_weak, *env;
  unsigned version; /* of a memo slot: bumped at each change */
} Slot;
static Slot memo[N_MEMO];
static unsigned memo_next;

/* Miss(key): the call goes through the full path, which files its entry
 * under key (None: no lean key). Steals nothing. */
static PyObject *make_miss(PyObject *key) {
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
static int at_top_level(void) {
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
static PyObject *make_key(PyObject *args, PyObject *kernel,
                          PyObject *out_shape, PyObject *grid,
                          PyObject *metaparams);
static PyObject *read_env(PyObject *kernel);

/* Whether the call may have a lean key: 1, 0, or -1 with an error set. */
static int may_have_key(PyObject *out_shape, PyObject *grid) {
  if (!PyTuple_CheckExact(grid) || (PyObject *)Py_TYPE(out_shape) != sds_type)
    return 0;
  return at_top_level();
}

static PyObject *build_key(PyObject *args, PyObject *kernel,
                           PyObject *out_shape, PyObject *grid,
                           PyObject *metaparams) {
  int may = may_have_key(out_shape, grid);
  if (may < 0) return NULL;
  if (!may) Py_RETURN_NONE;
  return make_key(args, kernel, out_shape, grid, metaparams);
}

/* build_key past its checks. */
static PyObject *make_key(PyObject *args, PyObject *kernel,
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
static PyObject *read_env(PyObject *kernel) {
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

/* 1 if a == b (identity first, as a dict lookup compares), 0 if not, -1 on
 * an error. */
static int same(PyObject *a, PyObject *b) {
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
static void slot_retain(Slot *slot) {
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

static void slot_release(Slot *slot) {
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
static void memo_write(int i, const Slot *fresh) {
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
static int memo_find(PyObject *args, PyObject *kernel, PyObject *out_shape,
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
static int lay_out_key(Slot *slot, PyObject *key) {
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
static int fill_slot(Slot *slot, PyObject *key, PyObject *entry) {
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

static PyObject *forget(PyObject *self, PyObject *unused) {
  Slot empty = {0};
  for (int i = 0; i < N_MEMO; i++) memo_write(i, &empty);
  Py_RETURN_NONE;
}

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
    Py_DECREF(answer);  /* error_miss: on_error raises otherwise */
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
  PyObject *objs[10], *env_parts;
  if (!PyArg_ParseTuple(a, "OOOOOOOOOOO", &objs[0], &objs[1], &objs[2],
                        &objs[3], &objs[4], &objs[5], &objs[6], &objs[7],
                        &objs[8], &objs[9], &env_parts))
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
  if (!PyDict_Check(objs[3])) {
    PyErr_SetString(PyExc_TypeError, "configure: entries must be a dict");
    return NULL;
  }
  PyObject **slots[10] = {&miss_type, &sds_type, &plain_kernel, &entries,
                          &eager_ready, &sync_env, &autotune_env, &on_error,
                          &error_miss, &unflatten};
  for (int i = 0; i < 10; i++) {
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
     "eager_ready, sync_env, autotune_env, on_error, error_miss, unflatten, "
     "env_parts)"},
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
