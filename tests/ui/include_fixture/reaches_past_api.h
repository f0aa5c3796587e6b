// Fixture for ui_include_check_fails: a UI file that reaches past engine/api.
#pragma once

#include "engine/api/runs.h"
#include "engine/store/run_store.h"
