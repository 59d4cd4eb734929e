/* The compiled eager hit (jt_dist._call._lean_hit): what its three parts
 * share. key.c builds lean.py's key; memo.c keeps the last hits and
 * matches calls against them; module.c runs a hit, is the module, and
 * says why it exists. */
#ifndef JT_DIST_LEAN_HIT_H_
#define JT_DIST_LEAN_HIT_H_

#ifndef Py_LIMITED_API
#define Py_LIMITED_API 0x030B0000
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* What lean.py hands over (configure), held until the next configure: each
 * a module-level object of jt_dist or jax. */
extern PyObject *miss_type;      /* lean.Miss: the answer when not a hit */
extern PyObject *sds_type;       /* jax.ShapeDtypeStruct */
extern PyObject *plain_kernel;   /* triton's JITFunction */
extern PyObject *entries;        /* dict: lean key -> Entry */
extern PyObject *eager_ready;    /* () -> (array type, top-level probe) | None */
extern PyObject *sync_env;       /* () -> the sync setting */
extern PyObject *autotune_env;   /* () -> every setting a launch reads */
extern PyObject *on_error;       /* (entry, exc): returns, or raises */
extern PyObject *unflatten;      /* jax.tree_util.tree_unflatten */
/* os.environ as environ_reader reads it (NULL where it falls back to the
 * readers above): the os module's dict, the object, its data, the
 * settings' keys. */
extern PyObject *os_module, *environ_obj, *environ_data, *sync_keys,
    *autotune_keys;
/* Found at the first eager call at top level (eager_ready). */
extern PyObject *array_type;
extern PyObject *top_level;

extern PyObject *s_value, *s_environ, *s_aval, *s_shape, *s_dtype,
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
extern Slot memo[N_MEMO];
extern unsigned memo_next;

/* key.c */
PyObject *make_miss(PyObject *key);
int at_top_level(void);
int may_have_key(PyObject *out_shape, PyObject *grid);
PyObject *build_key(PyObject *args, PyObject *kernel, PyObject *out_shape,
                    PyObject *grid, PyObject *metaparams);
PyObject *make_key(PyObject *args, PyObject *kernel, PyObject *out_shape,
                   PyObject *grid, PyObject *metaparams);
PyObject *read_env(PyObject *kernel);

/* memo.c */
int same(PyObject *a, PyObject *b);
void slot_retain(Slot *slot);
void slot_release(Slot *slot);
void memo_write(int i, const Slot *fresh);
int memo_find(PyObject *args, PyObject *kernel, PyObject *out_shape,
              PyObject *grid, PyObject *metaparams, Slot *found);
int lay_out_key(Slot *slot, PyObject *key);
int fill_slot(Slot *slot, PyObject *key, PyObject *entry);
PyObject *forget(PyObject *self, PyObject *unused);

#endif  /* JT_DIST_LEAN_HIT_H_ */
