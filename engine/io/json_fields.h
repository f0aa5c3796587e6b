// Internal to engine/io (project files and Keras model JSON): typed, path-aware readers of JSON
// fields. A reader that finds a bad value throws FieldError{path, message}; the public entry points
// (parseProject, modelFromKerasJson) catch it and turn it into an error value
// "<file>: <path>: <message>". Nothing outside engine/io includes this header.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/tensor.h"
#include "engine/model/layers.h"

namespace td::jsonio {

using Json = nlohmann::ordered_json;

struct FieldError {
    std::string path;     // "training.optimizer.config.learning_rate"; empty for the document
    std::string message;  // "expected a positive number, got -0.1"
};

[[noreturn]] void fail(const std::string& path, const std::string& message);

// "<prefix>: <path>: <message>" (parts left out when empty).
std::string formatError(const std::string& prefix, const FieldError& e);

// Parses JSON text; a syntax error throws FieldError{path, "invalid JSON at line L, column C:
// ..."}.
Json parseText(const std::string& text, const std::string& path);

std::string child(const std::string& path, const std::string& key);  // "a.b"
std::string child(const std::string& path, size_t index);            // "a[3]"

// How a value reads in "got ..." messages: -0.1, "adam", true, null, an object, an array.
std::string describe(const Json& v);

// Member lookup: nullptr when absent.
const Json* member(const Json& obj, const char* key);

// Every key of obj must be in valid: otherwise FieldError{path, "unknown key 'epocs'; did you
// mean 'epochs'? (valid keys: ...)"}.
void checkKeys(const Json& obj, const std::string& path, const std::vector<std::string>& valid);

const Json& requireObject(const Json& v, const std::string& path);
const Json& requireArray(const Json& v, const std::string& path);
const Json& requireMember(const Json& obj, const std::string& path, const char* key);

// A Keras object reference: a plain name ("adam") or {"class_name": ..., "config": {...}} (plus
// the "module" and "registered_name" Keras 3 writes). A null config counts as none; any other
// config must be an object. `what` names the thing in the error ("an optimizer name").
struct KerasRef {
    std::string name;      // as written
    std::string namePath;  // field path of the name, for errors
    const Json* config = nullptr;
};
KerasRef readKerasRef(const Json& v, const std::string& path, const std::string& what);

std::string getString(const Json& v, const std::string& path);
std::string getNonEmptyString(const Json& v, const std::string& path);
bool getBool(const Json& v, const std::string& path);
double getNumber(const Json& v, const std::string& path);
double getPositiveNumber(const Json& v, const std::string& path);
double getNonNegativeNumber(const Json& v, const std::string& path);
// Closed lower bound, open (or closed) upper bound: "expected a number in [0, 1), got 1.2".
double getNumberInRange(const Json& v, const std::string& path, double lo, double hi,
                        bool hiInclusive);
int64_t getInteger(const Json& v, const std::string& path);
int64_t getPositiveInteger(const Json& v, const std::string& path);
int64_t getNonNegativeInteger(const Json& v, const std::string& path);
uint64_t getUnsigned(const Json& v, const std::string& path);
std::optional<uint64_t> getOptionalSeed(const Json& v, const std::string& path);    // null or N
std::optional<double> getOptionalPositive(const Json& v, const std::string& path);  // null or x>0
// One of the listed strings: "expected one of "float32", "mixed_float16", got "fp8"".
std::string getOneOf(const Json& v, const std::string& path, const std::vector<std::string>& valid);

// Pretty text with a 2-space indent, like dump(2), except that arrays of scalars stay on one
// line ("batch_shape": [null, 28, 28]) and empty containers print as [] and {}.
std::string prettyJson(const Json& v);

std::string squote(const std::string& s);
std::string joinQuoted(const std::vector<std::string>& items);
std::string joinPlain(const std::vector<std::string>& items);

// Keras model JSON (keras_json.cpp). `path` prefixes error paths ("model" inside a project).
// The value may be the to_json() object or its text (a JSON string). Keys accepted but not
// applied are reported in `warnings` ("<path>: <message>") when it is not null.
ModelSpec parseKerasModel(const Json& root, const std::string& path,
                          std::vector<std::string>* warnings = nullptr);
Json kerasModelToJson(const ModelSpec& model);

}  // namespace td::jsonio
