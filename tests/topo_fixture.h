/* Loading a topology fixture in tests (tests/fixtures/topologies, passed as MT_TOPO_FIXTURES). */
#ifndef MT_TESTS_TOPO_FIXTURE_H
#define MT_TESTS_TOPO_FIXTURE_H

#include "check.h"

#include "topo/topology.h"

#include <stdio.h>

#ifndef MT_TOPO_FIXTURES
#error "MT_TOPO_FIXTURES must name the fixture directory"
#endif

/* Loads fixture `name`, recording a failed check (and returning NULL) when it does not load. */
static inline mt_topo *load_fixture(const char *name) {
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", MT_TOPO_FIXTURES, name);
    mt_topo *t = NULL;
    mt_status s = mt_topo_load_file(path, &t);
    CHECK_MSG(s == MT_OK && t, "%s: %s", name, mt_last_error());
    return s == MT_OK ? t : NULL;
}

#endif
