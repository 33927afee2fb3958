import sys
def test_path():
    print(sys.path[:4])
    import tests.fakes
