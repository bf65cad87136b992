/* The bounding sketch's insert loop (ldp_beam/bounding.py, _MinTable) in C.
 *
 * One call inserts a chunk of candidate rows into one open-addressing table: per row, linear
 * probing from the unit's home slot to the slot holding its unit hash (or an empty one, which
 * it claims), then the row replaces the slot's row when it is smaller in (priority, stream,
 * record). The result is the exact per-unit minimum whatever the order the rows come in, so
 * it is the table numpy's vectorized rounds build (bounding.py keeps that path, used when this
 * module was not compiled); tests/test_units_table.py checks the two agree, ties included.
 *
 * Why C: the numpy rounds cost ~60-90 ns a row (a dozen whole-array passes); this loop is one
 * pass with the next rows' home slots prefetched, ~10-20 ns a row. It is built by setuptools
 * as an optional extension (no compiler, no module: bounding.py falls back to numpy) and uses
 * only the buffer protocol (no numpy headers). The GIL is released during the loop.
 *
 * The table (see _MinTable): `kp`, alloc x 2 uint64 (unit hash, 0 = empty; priority), `ref`,
 * alloc uint64 (the row's packed reference, or its record number in wide mode), `s`, alloc
 * uint64 or None (the row's stream in wide mode). A row's identity, which breaks equal
 * priorities: narrow, (names[ref >> 48], ref & (2^48 - 1)); wide, (s, (int64) ref).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define REF_BITS 48
#define REF_MASK ((((uint64_t)1) << REF_BITS) - 1)
#define PREFETCH 16

static inline uint64_t home(uint64_t u, uint64_t size) {
    return (((u >> 1) & 0xFFFFFFFFull) * size) >> 32;
}

typedef struct {
    Py_buffer view;
    int held;
} buf_t;

static int get_buf(PyObject *obj, buf_t *b, int writable, const char *name, Py_ssize_t n,
                   int allow_none) {
    b->held = 0;
    if (obj == Py_None) {
        if (allow_none) return 0;
        PyErr_Format(PyExc_TypeError, "%s: an array is required", name);
        return -1;
    }
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, &b->view, flags) < 0) return -1;
    b->held = 1;
    if (b->view.itemsize != 8 || b->view.len % 8 != 0) {
        PyErr_Format(PyExc_TypeError, "%s: 64-bit items are required", name);
        return -1;
    }
    if (n >= 0 && b->view.len / 8 != n) {
        PyErr_Format(PyExc_ValueError, "%s: %zd items, expected %zd", name,
                     b->view.len / 8, n);
        return -1;
    }
    return 0;
}

static void release(buf_t *b) {
    if (b->held) PyBuffer_Release(&b->view);
    b->held = 0;
}

/* (stream, record) of a row: is a smaller than b? */
static inline int ident_less(uint64_t ra, uint64_t sa, uint64_t rb, uint64_t sb,
                             const uint64_t *names, Py_ssize_t nnames, int wide, int *bad) {
    if (wide) {
        if (sa != sb) return sa < sb;
        return (int64_t)ra < (int64_t)rb;
    }
    uint64_t ia = ra >> REF_BITS, ib = rb >> REF_BITS;
    if ((Py_ssize_t)ia >= nnames || (Py_ssize_t)ib >= nnames) {
        *bad = 1;
        return 0;
    }
    if (names[ia] != names[ib]) return names[ia] < names[ib];
    return (ra & REF_MASK) < (rb & REF_MASK);
}

typedef struct {
    uint64_t *K, *R, *S;  /* slots (unit hash, priority), references, streams (wide) or NULL */
    uint64_t size, alloc;
} table_t;

/* Insert rows [0, n) into tables[u >> shift] (shift 64: one table); claimed[k] += new units.
 * Returns 0, or 1 when a table was found full (a caller's bug: chunks are sized to fit). */
static int insert_rows(table_t *tables, int shift, Py_ssize_t *claimed, const uint64_t *U,
                       const uint64_t *P, const uint64_t *RR, const uint64_t *RS,
                       Py_ssize_t n, const uint64_t *N, Py_ssize_t nnames, int wide) {
    int bad = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i + PREFETCH < n) {
            uint64_t v = U[i + PREFETCH];
            table_t *f = &tables[shift < 64 ? v >> shift : 0];
            __builtin_prefetch(f->K + 2 * home(v, f->size), 1, 1);
        }
        uint64_t key = U[i];
        Py_ssize_t k = shift < 64 ? (Py_ssize_t)(key >> shift) : 0;
        table_t *t = &tables[k];
        uint64_t *K = t->K;
        uint64_t pos = home(key, t->size), probes = 0;
        for (;;) {
            uint64_t c = K[2 * pos];
            if (c == key || c == 0) break;
            if (++pos == t->alloc) pos = 0;
            if (++probes > t->alloc) return 1;
        }
        uint64_t rs_i = wide ? RS[i] : 0;
        if (K[2 * pos] == 0) {  /* a new unit claims the empty slot */
            K[2 * pos] = key;
            K[2 * pos + 1] = P[i];
            t->R[pos] = RR[i];
            if (wide) t->S[pos] = rs_i;
            claimed[k]++;
            continue;
        }
        uint64_t cur = K[2 * pos + 1];
        if (P[i] < cur || (P[i] == cur &&
                           ident_less(RR[i], rs_i, t->R[pos], wide ? t->S[pos] : 0, N, nnames,
                                      wide, &bad))) {
            K[2 * pos + 1] = P[i];
            t->R[pos] = RR[i];
            if (wide) t->S[pos] = rs_i;
        }
    }
    return 0;
}

#define MAX_TABLES 64

/* insert(tables, names, u, prio, ref_rows, stream_rows) -> [units claimed per table] */
static PyObject *insert(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *tabs_o, *names_o, *u_o, *p_o, *r_o, *rs_o;
    if (!PyArg_ParseTuple(args, "O!OOOOO", &PyList_Type, &tabs_o, &names_o, &u_o, &p_o, &r_o,
                          &rs_o))
        return NULL;
    Py_ssize_t nt = PyList_GET_SIZE(tabs_o);
    if (nt < 1 || nt > MAX_TABLES || (nt & (nt - 1))) {
        PyErr_Format(PyExc_ValueError, "tables: a power of two up to %d, not %zd", MAX_TABLES,
                     nt);
        return NULL;
    }
    int shift = 64;
    for (Py_ssize_t m = nt; m > 1; m >>= 1) shift--;
    buf_t bufs[3 * MAX_TABLES];
    table_t tables[MAX_TABLES];
    Py_ssize_t claimed[MAX_TABLES];
    memset(bufs, 0, sizeof(bufs));
    buf_t names = {0}, u = {0}, p = {0}, r = {0}, rs = {0};
    PyObject *result = NULL;
    int wide = -1;
    for (Py_ssize_t k = 0; k < nt; k++) {
        PyObject *t = PyList_GET_ITEM(tabs_o, k);
        PyObject *kp_o, *ref_o, *s_o;
        Py_ssize_t size;
        if (!PyTuple_Check(t) || !PyArg_ParseTuple(t, "OOOn", &kp_o, &ref_o, &s_o, &size)) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "tables: (kp, ref, s, size) tuples");
            goto done;
        }
        if (get_buf(kp_o, &bufs[3 * k], 1, "kp", -1, 0) < 0) goto done;
        Py_ssize_t alloc = bufs[3 * k].view.len / 16;
        if (bufs[3 * k].view.len % 16 != 0 || size <= 0 || size > alloc ||
            size > 0xFFFFFFFFll) {
            PyErr_Format(PyExc_ValueError, "size %zd does not fit a table of %zd slots", size,
                         alloc);
            goto done;
        }
        if (get_buf(ref_o, &bufs[3 * k + 1], 1, "ref", alloc, 0) < 0) goto done;
        if (get_buf(s_o, &bufs[3 * k + 2], 1, "s", alloc, 1) < 0) goto done;
        int w = bufs[3 * k + 2].held;
        if (wide >= 0 && w != wide) {
            PyErr_SetString(PyExc_ValueError, "tables: all wide or all narrow");
            goto done;
        }
        wide = w;
        tables[k].K = (uint64_t *)bufs[3 * k].view.buf;
        tables[k].R = (uint64_t *)bufs[3 * k + 1].view.buf;
        tables[k].S = w ? (uint64_t *)bufs[3 * k + 2].view.buf : NULL;
        tables[k].size = (uint64_t)size;
        tables[k].alloc = (uint64_t)alloc;
        claimed[k] = 0;
    }
    if (get_buf(names_o, &names, 0, "names", -1, wide) < 0) goto done;
    if (get_buf(u_o, &u, 0, "u", -1, 0) < 0) goto done;
    Py_ssize_t n = u.view.len / 8;
    if (get_buf(p_o, &p, 0, "prio", n, 0) < 0) goto done;
    if (get_buf(r_o, &r, 0, "ref rows", n, 0) < 0) goto done;
    if (get_buf(rs_o, &rs, 0, "stream rows", n, 1) < 0) goto done;
    if (wide != rs.held) {
        PyErr_SetString(PyExc_ValueError, "wide tables take the rows' streams, narrow ones not");
        goto done;
    }
    const uint64_t *N = names.held ? (const uint64_t *)names.view.buf : NULL;
    Py_ssize_t nnames = names.held ? names.view.len / 8 : 0;
    const uint64_t *U = (const uint64_t *)u.view.buf, *P = (const uint64_t *)p.view.buf;
    const uint64_t *RR = (const uint64_t *)r.view.buf;
    const uint64_t *RS = wide ? (const uint64_t *)rs.view.buf : NULL;
    int bad = 0, zero = 0, full = 0;

    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {  /* checked first: the tables are left as they were */
        if (U[i] == 0) zero = 1;
        if (!wide && (Py_ssize_t)(RR[i] >> REF_BITS) >= nnames) bad = 1;
    }
    if (!zero && !bad) full = insert_rows(tables, shift, claimed, U, P, RR, RS, n, N, nnames,
                                          wide);
    Py_END_ALLOW_THREADS

    if (zero) {
        PyErr_SetString(PyExc_ValueError, "a unit hash of 0 (hashes have their low bit set)");
        goto done;
    }
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "a packed reference names a stream index past names");
        goto done;
    }
    if (full) {
        PyErr_SetString(PyExc_RuntimeError, "a bounding table is full (a chunk was too large)");
        goto done;
    }
    result = PyList_New(nt);
    if (result == NULL) goto done;
    for (Py_ssize_t k = 0; k < nt; k++) {
        PyObject *c = PyLong_FromSsize_t(claimed[k]);
        if (c == NULL) { Py_CLEAR(result); goto done; }
        PyList_SET_ITEM(result, k, c);
    }
done:
    for (Py_ssize_t k = 0; k < 3 * nt; k++) release(&bufs[k]);
    release(&names); release(&u); release(&p); release(&r); release(&rs);
    return result;
}

/* rehash(kp, ref, s, (kp2, ref2, s2, size2)) -> units: a table's held units (key != 0) into an
 * empty table (every key 0; its priorities and references are never read) of another size (a
 * table that grows). The source is scanned in slot order, so
 * the destination's home slots come nearly in order too (home is monotone in the hash bits):
 * the writes stream through memory instead of missing the cache, and no array of entries is
 * gathered first. Units are distinct, so each one claims the first empty slot from its home;
 * finding its own hash there means the source held a unit twice (refused, nothing returned). */
static PyObject *rehash(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *kp_o, *ref_o, *s_o, *dst_o, *kp2_o, *ref2_o, *s2_o;
    Py_ssize_t size2;
    if (!PyArg_ParseTuple(args, "OOOO!", &kp_o, &ref_o, &s_o, &PyTuple_Type, &dst_o))
        return NULL;
    if (!PyArg_ParseTuple(dst_o, "OOOn", &kp2_o, &ref2_o, &s2_o, &size2)) return NULL;
    buf_t kp = {0}, ref = {0}, s = {0}, kp2 = {0}, ref2 = {0}, s2 = {0};
    PyObject *result = NULL;
    if (get_buf(kp_o, &kp, 0, "kp", -1, 0) < 0) goto done;
    Py_ssize_t alloc = kp.view.len / 16;
    if (get_buf(ref_o, &ref, 0, "ref", alloc, 0) < 0) goto done;
    if (get_buf(s_o, &s, 0, "s", alloc, 1) < 0) goto done;
    if (get_buf(kp2_o, &kp2, 1, "kp2", -1, 0) < 0) goto done;
    Py_ssize_t alloc2 = kp2.view.len / 16;
    if (kp.view.len % 16 != 0 || kp2.view.len % 16 != 0 || size2 <= 0 || size2 > alloc2 ||
        size2 > 0xFFFFFFFFll) {
        PyErr_Format(PyExc_ValueError, "size %zd does not fit a table of %zd slots", size2,
                     alloc2);
        goto done;
    }
    if (get_buf(ref2_o, &ref2, 1, "ref2", alloc2, 0) < 0) goto done;
    if (get_buf(s2_o, &s2, 1, "s2", alloc2, 1) < 0) goto done;
    if (s.held != s2.held) {
        PyErr_SetString(PyExc_ValueError, "rehash: both tables wide or both narrow");
        goto done;
    }
    const uint64_t *K = (const uint64_t *)kp.view.buf, *R = (const uint64_t *)ref.view.buf;
    const uint64_t *S = s.held ? (const uint64_t *)s.view.buf : NULL;
    uint64_t *K2 = (uint64_t *)kp2.view.buf, *R2 = (uint64_t *)ref2.view.buf;
    uint64_t *S2 = s2.held ? (uint64_t *)s2.view.buf : NULL;
    Py_ssize_t units = 0;
    int dup = 0, full = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < alloc && !dup && !full; i++) {
        uint64_t key = K[2 * i];
        if (key == 0) continue;
        uint64_t pos = home(key, (uint64_t)size2), probes = 0;
        while (K2[2 * pos] != 0) {
            if (K2[2 * pos] == key) { dup = 1; break; }
            if (++pos == (uint64_t)alloc2) pos = 0;
            if (++probes > (uint64_t)alloc2) { full = 1; break; }
        }
        if (dup || full) break;
        K2[2 * pos] = key;
        K2[2 * pos + 1] = K[2 * i + 1];
        R2[pos] = R[i];
        if (S2 != NULL) S2[pos] = S[i];
        units++;
    }
    Py_END_ALLOW_THREADS
    if (dup) {
        PyErr_SetString(PyExc_ValueError, "rehash: the source table holds a unit twice");
        goto done;
    }
    if (full) {
        PyErr_SetString(PyExc_RuntimeError, "rehash: the destination table is full");
        goto done;
    }
    result = PyLong_FromSsize_t(units);
done:
    release(&kp); release(&ref); release(&s); release(&kp2); release(&ref2); release(&s2);
    return result;
}

/* sort(a): a contiguous uint64 array sorted in place, by least-significant-digit radix (11-bit
 * digits, a pass only for the digits that are not the same in every item, histograms of all
 * of them counted in one read). The frozen sketch sorts its ~10 bytes-a-unit references so:
 * at 10^6 units ~10 ms against numpy's ~50 ms comparison sort on this machine. One scratch
 * array of the same size is allocated for the passes. */
#define RADIX_BITS 11
#define RADIX (1 << RADIX_BITS)
#define DIGITS ((64 + RADIX_BITS - 1) / RADIX_BITS)

static PyObject *sort_u64(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *a_o;
    if (!PyArg_ParseTuple(args, "O", &a_o)) return NULL;
    buf_t a = {0};
    if (get_buf(a_o, &a, 1, "a", -1, 0) < 0) { release(&a); return NULL; }
    Py_ssize_t n = a.view.len / 8;
    uint64_t *x = (uint64_t *)a.view.buf;
    uint64_t *tmp = n > 1 ? (uint64_t *)PyMem_RawMalloc((size_t)n * 8) : NULL;
    size_t (*hist)[RADIX] = (size_t (*)[RADIX])PyMem_RawCalloc(DIGITS, sizeof(*hist));
    if ((n > 1 && tmp == NULL) || hist == NULL) {
        PyMem_RawFree(tmp); PyMem_RawFree(hist); release(&a);
        return PyErr_NoMemory();
    }
    Py_BEGIN_ALLOW_THREADS
    if (n > 1) {
        for (Py_ssize_t i = 0; i < n; i++) {
            uint64_t v = x[i];
            for (int d = 0; d < DIGITS; d++) hist[d][(v >> (d * RADIX_BITS)) & (RADIX - 1)]++;
        }
        uint64_t *src = x, *dst = tmp;
        for (int d = 0; d < DIGITS; d++) {
            size_t *h = hist[d], sum = 0;
            int one = 0;
            for (int b = 0; b < RADIX; b++) if (h[b] == (size_t)n) { one = 1; break; }
            if (one) continue;  /* every item has this digit: the pass would change nothing */
            for (int b = 0; b < RADIX; b++) { size_t c = h[b]; h[b] = sum; sum += c; }
            int shift = d * RADIX_BITS;
            for (Py_ssize_t i = 0; i < n; i++) {
                uint64_t v = src[i];
                dst[h[(v >> shift) & (RADIX - 1)]++] = v;
            }
            uint64_t *t = src; src = dst; dst = t;
        }
        if (src != x) memcpy(x, src, (size_t)n * 8);
    }
    Py_END_ALLOW_THREADS
    PyMem_RawFree(tmp);
    PyMem_RawFree(hist);
    release(&a);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"sort", sort_u64, METH_VARARGS,
     "sort(a) -> None\n\nA contiguous array of 64-bit unsigned integers sorted in place (radix)."},
    {"rehash", rehash, METH_VARARGS,
     "rehash(kp, ref, s, (kp2, ref2, s2, size2)) -> units\n\n"
     "A table's held units (key != 0) into an empty table of size2 home slots (see "
     "ldp_beam/bounding.py, _MinTable._grow)."},
    {"insert", insert, METH_VARARGS,
     "insert(tables, names, u, prio, ref_rows, stream_rows) -> units claimed per table\n\n"
     "Insert candidate rows into bounding tables, row i into tables[u[i] >> (64 - log2 "
     "len(tables))], each a (kp, ref, s or None, size) tuple (see ldp_beam/bounding.py)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_minsketch",
                                    "The bounding sketch's insert loop (see _minsketch.c).", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__minsketch(void) { return PyModule_Create(&module); }
