#include "engine/api/projects.h"

#include <utility>

namespace td::api {

Result<Project> loadProjectFile(const std::string& path) {
    return td::loadProject(path);
}

Result<Project> parseProjectText(const std::string& jsonText, const std::string& name) {
    return td::parseProject(jsonText, name);
}

Status saveProjectFile(const Project& project, const std::string& path) {
    return td::saveProject(project, path);
}

std::string projectText(const Project& project) {
    return td::projectToJson(project);
}

Status validateProject(const Project& project) {
    // The parser holds every rule a field must follow, with the field's path in the message; the
    // text form of a project holds every field, so parsing it checks them all.
    TD_ASSIGN_OR_RETURN(Project parsed, td::parseProject(td::projectToJson(project), "project"));
    ModelSpec model = parsed.model;
    TD_ASSIGN_OR_RETURN(ModelInfo info, td::inferShapes(model));
    return td::checkProjectResources(parsed, info);
}

std::string firstProjectDifference(const Project& a, const Project& b) {
    return td::projectDifference(a, b);
}

Result<ModelSummary> summarizeModel(const ModelSpec& model) {
    ModelSummary s;
    s.model = model;
    TD_ASSIGN_OR_RETURN(s.info, td::inferShapes(s.model));
    s.table = td::summaryTable(s.model, s.info);
    return s;
}

}  // namespace td::api
