// SystemLibrary (engine/core/module_loader.h), the one way TrainDeck opens a system library (the
// CUDA libraries, NVML): a real library (glibc's libm) opens and its symbols resolve into typed
// function pointers that work; the first candidate soname that loads wins; a library that is
// nowhere names every soname tried with dlerror's reason; missing symbols are named.
#include <dlfcn.h>

#include <QTest>
#include <string>

#include "engine/core/module_loader.h"

using namespace td;

namespace {

// What dlopen says about `soname` here (the loader's own words, in whatever language it uses).
std::string dlopenReason(const char* soname) {
    if (void* h = dlopen(soname, RTLD_NOW | RTLD_LOCAL)) {
        dlclose(h);
        return "it loads";
    }
    const char* e = dlerror();
    return e ? e : "";
}

bool contains(const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
}

}  // namespace

class TestModuleLoader : public QObject {
    Q_OBJECT
  private slots:
    void opensLibraryAndResolvesSymbols() {
        auto lib = SystemLibrary::open("libm", {"libm.so.6"});
        QVERIFY2(lib.ok(), lib.ok() ? "" : lib.error().c_str());
        QCOMPARE(lib->soname(), std::string("libm.so.6"));
        double (*cosFn)(double) = nullptr;
        double (*sqrtFn)(double) = nullptr;
        const Status resolved = lib->resolve({{"cos", cosFn}, {"sqrt", sqrtFn}});
        QVERIFY2(resolved.ok(), resolved.ok() ? "" : resolved.error().c_str());
        QVERIFY(cosFn != nullptr && sqrtFn != nullptr);
        QCOMPARE(cosFn(0.0), 1.0);
        QCOMPARE(sqrtFn(2.25), 1.5);
    }

    // The first soname that loads is used; those before it that do not are passed over.
    void firstCandidateThatLoadsWins() {
        auto lib = SystemLibrary::open("libm", {"libtraindeck_no_such_library.so.1", "libm.so.6"});
        QVERIFY2(lib.ok(), lib.ok() ? "" : lib.error().c_str());
        QCOMPARE(lib->soname(), std::string("libm.so.6"));
    }

    // A library that is nowhere: the error says what could not be loaded and, for every soname
    // tried, the dynamic loader's reason.
    void missingLibraryNamesEverySonameTried() {
        const char* a = "libtraindeck_missing_a.so.1";
        const char* b = "libtraindeck_missing_b.so";
        auto lib = SystemLibrary::open("The Test Library", {a, b});
        QVERIFY(!lib.ok());
        const std::string& e = lib.error();
        QVERIFY2(e.rfind("cannot load The Test Library: ", 0) == 0, e.c_str());
        QVERIFY2(contains(e, a) && contains(e, b), e.c_str());
        const std::string whyA = dlopenReason(a), whyB = dlopenReason(b);
        QVERIFY(!whyA.empty() && !whyB.empty());
        QVERIFY2(contains(e, whyA) && contains(e, whyB), (e + "\n  vs " + whyA).c_str());
        QVERIFY2(e.find(a) < e.find(b), e.c_str());  // in the order tried

        auto none = SystemLibrary::open("The Test Library", {});
        QVERIFY(!none.ok());
        QVERIFY2(contains(none.error(), "cannot load The Test Library"), none.error().c_str());
    }

    // Symbols the library lacks are named with the library; the ones it has are still filled.
    void missingSymbolsAreNamed() {
        auto lib = SystemLibrary::open("libm", {"libm.so.6"});
        QVERIFY2(lib.ok(), lib.ok() ? "" : lib.error().c_str());
        double (*cosFn)(double) = nullptr;
        void (*missing)(int) = nullptr;
        int (*alsoMissing)() = [] { return 1; };  // overwritten with null
        const Status resolved = lib->resolve({{"cos", cosFn},
                                              {"traindeck_no_such_symbol", missing},
                                              {"traindeck_nor_this_one", alsoMissing}});
        QVERIFY(!resolved.ok());
        QCOMPARE(resolved.error(), std::string("libm (libm.so.6) has no traindeck_no_such_symbol, "
                                               "traindeck_nor_this_one"));
        QVERIFY(cosFn != nullptr);
        QVERIFY(missing == nullptr);
        QVERIFY(alsoMissing == nullptr);
    }
};

QTEST_GUILESS_MAIN(TestModuleLoader)
#include "test_module_loader.moc"
